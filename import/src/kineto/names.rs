//! Kineto's spellings of collectives and data types, mapped to NCCL's (`wire::names`).

use comminsight_wire::names::{Algo, DataType, Func, Proto};

/// The function of a PyTorch `Collective name` (`allreduce`, `_allgather_base`, ...).
/// `barrier` is an all-reduce of one element in PyTorch's NCCL backend.
pub fn func_from_collective(s: &str) -> Option<Func> {
    let l = s.trim().to_ascii_lowercase();
    let f = match l.trim_start_matches('_') {
        "allreduce" | "all_reduce" | "allreduce_coalesced" | "barrier" => Func::ALL_REDUCE,
        "allgather"
        | "allgather_base"
        | "all_gather"
        | "all_gather_base"
        | "allgather_into_tensor_coalesced"
        | "allgather_coalesced"
        | "all_gather_into_tensor" => Func::ALL_GATHER,
        "reducescatter"
        | "reduce_scatter_base"
        | "reduce_scatter"
        | "reduce_scatter_tensor"
        | "reduce_scatter_tensor_coalesced" => Func::REDUCE_SCATTER,
        "broadcast" => Func::BROADCAST,
        "reduce" => Func::REDUCE,
        "alltoall" | "all_to_all" | "alltoall_base" | "all_to_all_single" => Func::ALL_TO_ALL,
        "send" => Func::SEND,
        "recv" | "recv_anysource" => Func::RECV,
        "sendrecv" => Func::SEND_RECV,
        "gather" => Func::GATHER,
        "scatter" => Func::SCATTER,
        _ => return None,
    };
    Some(f)
}

/// The function named by a kernel name's second `_` token
/// (`ncclKernel_AllReduce_RING_LL_Sum_float(...)`, `ncclDevKernel_SendRecv(...)`).
pub fn func_from_kernel(name: &str) -> Option<Func> {
    let tok = base(name).split('_').nth(1)?;
    let f = match tok {
        "AllToAll" | "AlltoAll" | "AllToAllv" => Func::ALL_TO_ALL,
        "AllGatherV" => Func(12),
        t => Func::parse(t).filter(|f| f.0 != 0)?,
    };
    Some(f)
}

/// A kernel name without its argument list.
fn base(name: &str) -> &str {
    name.split('(').next().unwrap_or(name)
}

/// The data type of a PyTorch `dtype` (`Float`, `BFloat16`, `Long`, ...).
pub fn dtype_from_torch(s: &str) -> DataType {
    let n = match s.trim() {
        "Char" | "Int8" => "ncclInt8",
        "Byte" | "Bool" | "UInt8" => "ncclUint8",
        "Int" | "Int32" => "ncclInt32",
        "UInt32" => "ncclUint32",
        "Long" | "Int64" => "ncclInt64",
        "UInt64" => "ncclUint64",
        "Half" | "Float16" => "ncclFloat16",
        "Float" | "Float32" => "ncclFloat32",
        "Double" | "Float64" => "ncclFloat64",
        "BFloat16" => "ncclBfloat16",
        "Float8_e4m3fn" | "Float8_e4m3fnuz" => "ncclFloat8e4m3",
        "Float8_e5m2" | "Float8_e5m2fnuz" => "ncclFloat8e5m2",
        _ => return DataType(0),
    };
    DataType::from_name(n)
}

/// The data type of one kernel-name token (`float`, `half`, `int8_t`, `bf16`, `f32`, ...).
fn dtype_token(t: &str) -> Option<DataType> {
    let n = match t {
        "int8_t" | "i8" | "int8" | "char" => "ncclInt8",
        "uint8_t" | "u8" | "uint8" => "ncclUint8",
        "int32_t" | "i32" | "int" | "int32" => "ncclInt32",
        "uint32_t" | "u32" | "uint32" => "ncclUint32",
        "int64_t" | "i64" | "int64" => "ncclInt64",
        "uint64_t" | "u64" | "uint64" => "ncclUint64",
        "half" | "f16" | "fp16" => "ncclFloat16",
        "float" | "f32" | "fp32" => "ncclFloat32",
        "double" | "f64" | "fp64" => "ncclFloat64",
        "bf16" | "__nv_bfloat16" | "bfloat16" => "ncclBfloat16",
        "f8e4m3" | "e4m3" | "__nv_fp8_e4m3" => "ncclFloat8e4m3",
        "f8e5m2" | "e5m2" | "__nv_fp8_e5m2" => "ncclFloat8e5m2",
        _ => return None,
    };
    Some(DataType::from_name(n))
}

/// The data type a kernel name states: its last `_` token before `(` in the classic form
/// (`..._Sum_float`), else the last token that names a type (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`).
pub fn dtype_from_kernel(name: &str) -> DataType {
    base(name)
        .rsplit('_')
        .find_map(dtype_token)
        .unwrap_or(DataType(0))
}

/// Algorithm and protocol a kernel name states (`RING`, `LL`), unknown when it does not.
pub fn algo_proto_from_kernel(name: &str) -> (Algo, Proto) {
    let mut algo = Algo(0);
    let mut proto = Proto(0);
    for t in base(name).split('_').skip(2) {
        if algo.0 == 0 {
            if let Some(a) = Algo::parse(t).filter(|a| a.0 != 0) {
                algo = a;
                continue;
            }
        }
        if proto.0 == 0 {
            if let Some(p) = Proto::parse(t).filter(|p| p.0 != 0) {
                proto = p;
            }
        }
    }
    (algo, proto)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_give_func_dtype_algo_proto() {
        let k = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)";
        assert_eq!(func_from_kernel(k), Some(Func::ALL_REDUCE));
        assert_eq!(dtype_from_kernel(k).name(), "ncclFloat32");
        assert_eq!(
            algo_proto_from_kernel(k),
            (Algo::from_name("RING"), Proto::from_name("LL"))
        );
        let k = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)";
        assert_eq!(func_from_kernel(k), Some(Func::SEND_RECV));
        assert_eq!(dtype_from_kernel(k).name(), "ncclInt8");
        let k = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)";
        assert_eq!(func_from_kernel(k), Some(Func::ALL_GATHER));
        assert_eq!(dtype_from_kernel(k), DataType(0));
        assert_eq!(
            dtype_from_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL").name(),
            "ncclBfloat16"
        );
        assert_eq!(
            func_from_kernel("ncclDevKernel_AllToAll(x)"),
            Some(Func::ALL_TO_ALL)
        );
        assert_eq!(func_from_kernel("ncclDevKernel_Generic_4(x)"), None);
        assert_eq!(func_from_kernel("ncclKernel"), None);
    }

    #[test]
    fn torch_spellings_map() {
        assert_eq!(
            func_from_collective("_allgather_base"),
            Some(Func::ALL_GATHER)
        );
        assert_eq!(
            func_from_collective("reduce_scatter"),
            Some(Func::REDUCE_SCATTER)
        );
        assert_eq!(func_from_collective("barrier"), Some(Func::ALL_REDUCE));
        assert_eq!(
            func_from_collective("alltoall_base"),
            Some(Func::ALL_TO_ALL)
        );
        assert_eq!(func_from_collective("nonsense"), None);
        assert_eq!(dtype_from_torch("BFloat16").name(), "ncclBfloat16");
        assert_eq!(dtype_from_torch("Long").size(), 8);
        assert_eq!(dtype_from_torch("Short"), DataType(0));
    }
}
