//! Element-wise reductions over byte buffers (host memory stands in for device buffers).

use crate::types::{DataType, RedOp};

fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // subnormal
            let v = man as f32 * (1.0 / (1u32 << 24) as f32);
            return if sign != 0 { -v } else { v };
        }
    } else if exp == 31 {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 112) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 255 {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 31 {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = (man | 0x80_0000) >> (1 - e);
        let round = (m >> 12) & 1;
        return sign | ((m >> 13) + round) as u16;
    }
    let mut out = u32::from(sign) | ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (out & 1) == 1) {
        out += 1;
    }
    out as u16
}

fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) | 0x40) as u16;
    }
    let lsb = (x >> 16) & 1;
    ((x.wrapping_add(0x7fff + lsb)) >> 16) as u16
}

macro_rules! reduce_as {
    ($t:ty, $acc:expr, $src:expr, $op:expr, $sum:expr, $prod:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        for (a, s) in $acc.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
            let x = <$t>::from_ne_bytes(a.try_into().expect("chunk"));
            let y = <$t>::from_ne_bytes(s.try_into().expect("chunk"));
            let r: $t = match $op {
                RedOp::Sum | RedOp::Avg => $sum(x, y),
                RedOp::Prod => $prod(x, y),
                RedOp::Max => {
                    if y > x {
                        y
                    } else {
                        x
                    }
                }
                RedOp::Min => {
                    if y < x {
                        y
                    } else {
                        x
                    }
                }
            };
            a.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

fn reduce_half(acc: &mut [u8], src: &[u8], op: RedOp, to: fn(u16) -> f32, from: fn(f32) -> u16) {
    for (a, s) in acc.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
        let x = to(u16::from_ne_bytes([a[0], a[1]]));
        let y = to(u16::from_ne_bytes([s[0], s[1]]));
        let r = match op {
            RedOp::Sum | RedOp::Avg => x + y,
            RedOp::Prod => x * y,
            RedOp::Max => x.max(y),
            RedOp::Min => x.min(y),
        };
        a.copy_from_slice(&from(r).to_ne_bytes());
    }
}

/// `acc = acc (op) src`, element-wise. `Avg` accumulates a sum; call [`finish_avg`] at the end.
pub fn reduce(acc: &mut [u8], src: &[u8], dt: DataType, op: RedOp) {
    debug_assert_eq!(acc.len(), src.len());
    match dt {
        DataType::Int8 => reduce_as!(i8, acc, src, op, i8::wrapping_add, i8::wrapping_mul),
        DataType::Uint8 => reduce_as!(u8, acc, src, op, u8::wrapping_add, u8::wrapping_mul),
        DataType::Int32 => reduce_as!(i32, acc, src, op, i32::wrapping_add, i32::wrapping_mul),
        DataType::Uint32 => reduce_as!(u32, acc, src, op, u32::wrapping_add, u32::wrapping_mul),
        DataType::Int64 => reduce_as!(i64, acc, src, op, i64::wrapping_add, i64::wrapping_mul),
        DataType::Uint64 => reduce_as!(u64, acc, src, op, u64::wrapping_add, u64::wrapping_mul),
        DataType::Float32 => reduce_as!(f32, acc, src, op, |a, b| a + b, |a, b| a * b),
        DataType::Float64 => reduce_as!(f64, acc, src, op, |a, b| a + b, |a, b| a * b),
        DataType::Float16 => reduce_half(acc, src, op, f16_to_f32, f32_to_f16),
        DataType::Bfloat16 => reduce_half(acc, src, op, bf16_to_f32, f32_to_bf16),
    }
}

/// Divides a summed buffer by `n` (ncclAvg).
pub fn finish_avg(buf: &mut [u8], dt: DataType, n: usize) {
    macro_rules! div {
        ($t:ty, $conv:expr) => {{
            const N: usize = std::mem::size_of::<$t>();
            for a in buf.chunks_exact_mut(N) {
                let x = <$t>::from_ne_bytes(a.try_into().expect("chunk"));
                let r: $t = $conv(x);
                a.copy_from_slice(&r.to_ne_bytes());
            }
        }};
    }
    match dt {
        DataType::Int8 => div!(i8, |x: i8| x / n as i8),
        DataType::Uint8 => div!(u8, |x: u8| x / n as u8),
        DataType::Int32 => div!(i32, |x: i32| x / n as i32),
        DataType::Uint32 => div!(u32, |x: u32| x / n as u32),
        DataType::Int64 => div!(i64, |x: i64| x / n as i64),
        DataType::Uint64 => div!(u64, |x: u64| x / n as u64),
        DataType::Float32 => div!(f32, |x: f32| x / n as f32),
        DataType::Float64 => div!(f64, |x: f64| x / n as f64),
        DataType::Float16 => div!(u16, |x: u16| f32_to_f16(f16_to_f32(x) / n as f32)),
        DataType::Bfloat16 => div!(u16, |x: u16| f32_to_bf16(bf16_to_f32(x) / n as f32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn float_sum_max_and_avg() {
        let mut a = f32s(&[1.0, 5.0]);
        reduce(&mut a, &f32s(&[2.0, 3.0]), DataType::Float32, RedOp::Sum);
        assert_eq!(a, f32s(&[3.0, 8.0]));
        reduce(&mut a, &f32s(&[4.0, 1.0]), DataType::Float32, RedOp::Max);
        assert_eq!(a, f32s(&[4.0, 8.0]));
        finish_avg(&mut a, DataType::Float32, 2);
        assert_eq!(a, f32s(&[2.0, 4.0]));
    }

    #[test]
    fn int_prod_and_min() {
        let mut a: Vec<u8> = [3i64, -2].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let b: Vec<u8> = [4i64, 7].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut c = a.clone();
        reduce(&mut a, &b, DataType::Int64, RedOp::Prod);
        reduce(&mut c, &b, DataType::Int64, RedOp::Min);
        assert_eq!(
            a,
            [12i64, -14]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            c,
            [3i64, -2]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn half_precision_round_trips_small_integers() {
        for v in [0.0f32, 1.0, -2.0, 1024.0, 0.5] {
            assert_eq!(f16_to_f32(f32_to_f16(v)), v);
            assert_eq!(bf16_to_f32(f32_to_bf16(v)), v);
        }
        let mut a = f32_to_f16(1.5).to_ne_bytes().to_vec();
        reduce(
            &mut a,
            &f32_to_f16(2.0).to_ne_bytes(),
            DataType::Float16,
            RedOp::Sum,
        );
        assert_eq!(f16_to_f32(u16::from_ne_bytes([a[0], a[1]])), 3.5);
    }
}
