//! Choosing between the CUDA and host backends, probing for libcuda before touching cudarc.

use crate::error::{Error, Result};
use std::fmt;

/// Where batches end up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Device buffers are page-aligned host memory; "uploads" are memcpys on
    /// a copy thread. Used when CUDA is unavailable or not wanted.
    Host,
    /// Pinned host ring and device buffers on a CUDA GPU.
    Cuda,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Host => "host",
            Backend::Cuda => "cuda",
        })
    }
}

/// Which backend the loader should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// CUDA when the driver and a device are usable, otherwise host (logged).
    #[default]
    Auto,
    /// Always the host backend.
    Host,
    /// CUDA or an error; never a silent fallback.
    Cuda,
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "host" => Ok(BackendChoice::Host),
            "cuda" => Ok(BackendChoice::Cuda),
            _ => Err(Error::Config(format!("unknown backend {s:?} (auto, host, cuda)"))),
        }
    }
}

/// True when libcuda can be loaded. cudarc panics on first use when it cannot,
/// so this must be checked before any other CUDA call.
pub fn cuda_driver_present() -> bool {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only tries to dlopen the library; no CUDA call is made.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// A CUDA context ready for use, or the reason there is none.
#[cfg(feature = "cuda")]
pub(crate) type CudaHandle = std::sync::Arc<cudarc::driver::CudaContext>;
#[cfg(not(feature = "cuda"))]
pub(crate) type CudaHandle = std::convert::Infallible;

/// Opens device `ordinal` if the driver is present (`driver_present` is a
/// parameter so tests can simulate a machine without libcuda).
#[cfg(feature = "cuda")]
pub(crate) fn open_cuda(ordinal: usize, driver_present: bool) -> std::result::Result<CudaHandle, String> {
    use cudarc::driver::CudaContext;
    if !driver_present {
        return Err("libcuda.so not found (no NVIDIA driver on this machine)".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver reports no devices".into()),
        Ok(n) if ordinal >= n as usize => Err(format!("device {ordinal} requested but only {n} present")),
        Ok(_) => CudaContext::new(ordinal).map_err(|e| format!("cannot open device {ordinal}: {e}")),
        Err(e) => Err(format!("CUDA driver unusable: {e}")),
    }
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn open_cuda(_ordinal: usize, _driver_present: bool) -> std::result::Result<CudaHandle, String> {
    Err("built without the `cuda` feature".into())
}

/// Resolves `choice` to a backend (and context), logging the decision.
pub(crate) fn select(
    choice: BackendChoice,
    ordinal: usize,
    driver_present: bool,
) -> Result<(Backend, Option<CudaHandle>)> {
    match choice {
        BackendChoice::Host => {
            log::info!("stagefs-reader: using the host backend (requested)");
            Ok((Backend::Host, None))
        }
        BackendChoice::Cuda => {
            let ctx = open_cuda(ordinal, driver_present).map_err(Error::CudaUnavailable)?;
            log::info!("stagefs-reader: using the CUDA backend on device {ordinal}");
            Ok((Backend::Cuda, Some(ctx)))
        }
        BackendChoice::Auto => match open_cuda(ordinal, driver_present) {
            Ok(ctx) => {
                log::info!("stagefs-reader: using the CUDA backend on device {ordinal}");
                Ok((Backend::Cuda, Some(ctx)))
            }
            Err(why) => {
                log::warn!("stagefs-reader: {why}; falling back to the host backend (batches stay in host memory)");
                Ok((Backend::Host, None))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_to_host_without_driver() {
        let (b, ctx) = select(BackendChoice::Auto, 0, false).unwrap();
        assert_eq!(b, Backend::Host);
        assert!(ctx.is_none());
    }

    #[test]
    fn explicit_cuda_without_driver_is_an_error() {
        let err = select(BackendChoice::Cuda, 0, false).unwrap_err();
        assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
    }

    #[test]
    fn backend_choice_parses() {
        assert_eq!("host".parse::<BackendChoice>().unwrap(), BackendChoice::Host);
        assert!("gpu".parse::<BackendChoice>().is_err());
    }
}
