//! Finding and opening RDMA devices.
use super::context::Context;
use super::error::{Error, Result};
use std::ffi::CStr;
use std::sync::Arc;

/// The names of the RDMA devices on this machine (rxe0, mlx5_0, ...).
pub fn device_names() -> Vec<String> {
    let mut n = 0;
    // SAFETY: the list is freed below; names are copied out before.
    unsafe {
        let list = rdma_sys::ibv_get_device_list(&mut n);
        if list.is_null() {
            return Vec::new();
        }
        let names = (0..n as usize)
            .map(|i| {
                CStr::from_ptr(rdma_sys::ibv_get_device_name(*list.add(i)))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        rdma_sys::ibv_free_device_list(list);
        names
    }
}

/// Opens the device called `name`, or the first one when `name` is None.
pub fn open_device(name: Option<&str>) -> Result<Arc<Context>> {
    let mut n = 0;
    // SAFETY: the device list outlives the open call; the context does not need the list.
    unsafe {
        let list = rdma_sys::ibv_get_device_list(&mut n);
        if list.is_null() {
            return Err(Error::last("ibv_get_device_list"));
        }
        let mut found = None;
        let mut names = Vec::new();
        for i in 0..n as usize {
            let dev = *list.add(i);
            let dev_name = CStr::from_ptr(rdma_sys::ibv_get_device_name(dev))
                .to_string_lossy()
                .into_owned();
            if found.is_none() && name.is_none_or(|want| want == dev_name) {
                found = Some((dev, dev_name.clone()));
            }
            names.push(dev_name);
        }
        let result = match found {
            None if names.is_empty() => Err(Error::other("open device", "no RDMA devices found")),
            None => Err(Error::other(
                "open device",
                format!(
                    "no device named {} (have: {})",
                    name.unwrap_or(""),
                    names.join(", ")
                ),
            )),
            Some((dev, dev_name)) => {
                let ctx = rdma_sys::ibv_open_device(dev);
                if ctx.is_null() {
                    Err(Error::last("ibv_open_device"))
                } else {
                    Ok(Arc::new(Context::from_raw(ctx, dev_name)))
                }
            }
        };
        rdma_sys::ibv_free_device_list(list);
        result
    }
}
