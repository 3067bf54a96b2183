//! The one NVML call `nvml-wrapper` does not offer safely: field values scoped to an NVLink
//! (`nvmlFieldValue_t::scopeId` = the link index), which its `field_values_for` leaves at 0.

use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlFieldValue_t, nvmlReturn_t};

/// `nvmlDeviceGetFieldValues` as the library exports it.
pub type FieldValuesFn =
    unsafe extern "C" fn(nvmlDevice_t, i32, *mut nvmlFieldValue_t) -> nvmlReturn_t;

/// One link's two field values, each its own result.
pub type LinkFields = (u32, Result<u64, NvmlError>, Result<u64, NvmlError>);

/// Per link of `links`: `(link, field a, field b)` of the two field ids `ids`, in one call;
/// each value is its own result (a field NVML does not support on the device fails alone).
pub fn scoped_fields(
    f: FieldValuesFn,
    d: &Device<'_>,
    links: &[u32],
    ids: [u32; 2],
) -> Result<Vec<LinkFields>, NvmlError> {
    // SAFETY: nvmlFieldValue_t is a plain C struct (integers and a union of integers / a
    // double): all-zero is a valid value.
    let zero: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
    let mut vals: Vec<nvmlFieldValue_t> = links
        .iter()
        .flat_map(|&l| {
            ids.map(|id| nvmlFieldValue_t {
                fieldId: id,
                scopeId: l,
                ..zero
            })
        })
        .collect();
    // SAFETY: the handle belongs to a live `Nvml` (the device borrows it); `vals` holds
    // exactly `len` initialised entries NVML writes into, and nothing keeps the pointer.
    let r = unsafe { f(d.handle(), vals.len() as i32, vals.as_mut_ptr()) };
    nvml_try(r)?;
    let value = |v: &nvmlFieldValue_t| -> Result<u64, NvmlError> {
        nvml_try(v.nvmlReturn)?;
        // SAFETY: NVML wrote the union; every member is an integer or a double of at most 8
        // bytes, and the value type says which (3: unsigned long long, the throughput fields').
        let x = unsafe {
            match v.valueType {
                0 => v.value.dVal.max(0.0) as u64,
                1 => u64::from(v.value.uiVal),
                2 => v.value.ulVal,
                4 => v.value.sllVal.max(0) as u64,
                5 => v.value.siVal.max(0) as u64,
                6 => u64::from(v.value.usVal),
                _ => v.value.ullVal,
            }
        };
        Ok(x)
    };
    Ok(links
        .iter()
        .enumerate()
        .map(|(k, &l)| (l, value(&vals[2 * k]), value(&vals[2 * k + 1])))
        .collect())
}
