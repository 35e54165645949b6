//! A GPU as meshd sees it: name, SMs, compute capability and `sm_XY`, host-native atomics, MPS, SM partitioning.

use std::ffi::CStr;

use crate::driver::{self, check};
use crate::error::CudaError;
use cudarc::driver::sys::{self, CUdevice_attribute as A};

/// How SMs may be split into green contexts on this device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmPartitioning {
    /// SMs the device resource reports.
    pub sm_count: u32,
    /// Smallest group a split can make.
    pub min_partition: u32,
    /// Groups are multiples of this.
    pub alignment: u32,
}

impl SmPartitioning {
    /// Checks a request for `n` SMs; the refusal carries the device's numbers.
    pub fn check(&self, n: u32) -> Result<(), CudaError> {
        let fits = n >= self.min_partition && n % self.alignment.max(1) == 0 && n <= self.sm_count;
        if fits {
            return Ok(());
        }
        Err(CudaError::SmPartition {
            asked: n,
            detail: format!(
                "this device splits its {} SMs into groups of at least {} and multiples of {}",
                self.sm_count, self.min_partition, self.alignment
            ),
        })
    }
}

/// One GPU.
#[derive(Debug, Clone)]
pub struct Device {
    /// The driver's handle (ordinal).
    pub handle: sys::CUdevice,
    /// `cuDeviceGetName`.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// `HOST_NATIVE_ATOMIC_SUPPORTED`.
    pub host_atomics: bool,
    /// `MPS_ENABLED`: this process reaches the GPU through an MPS server.
    pub mps_enabled: bool,
    /// `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`.
    pub host_pointer_for_registered: bool,
}

impl Device {
    /// Device `ordinal`, after loading and initialising the driver.
    pub fn get(ordinal: i32) -> Result<Self, CudaError> {
        driver::init()?;
        let mut count = 0;
        // SAFETY: the driver is initialised; valid out-pointer.
        check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) })?;
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!("device {ordinal} asked for, the driver sees {count}")));
        }
        let mut handle = 0;
        // SAFETY: valid out-pointer, ordinal in range.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut handle, ordinal) })?;
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer's length is passed.
        check("cuDeviceGetName", unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, handle) })?;
        // SAFETY: the driver NUL-terminates the name within the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let attr = |a: A| -> Result<i32, CudaError> {
            let mut v = 0;
            // SAFETY: valid out-pointer, valid device.
            check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, handle) })?;
            Ok(v)
        };
        Ok(Self {
            handle,
            name,
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            compute_capability: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            host_atomics: attr(A::CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED)? != 0,
            mps_enabled: attr(A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED)? != 0,
            host_pointer_for_registered: attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)? != 0,
        })
    }

    /// The architecture nvJitLink targets: `sm_90` for compute capability 9.0.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }

    /// The device's SM resource: count, minimum partition and alignment, read off the driver.
    pub fn sm_partitioning(&self) -> Result<SmPartitioning, CudaError> {
        let missing = driver::missing_symbols(driver::GREEN_ENTRY_POINTS);
        if !missing.is_empty() {
            return Err(CudaError::NoDriver(format!("green contexts need {} (driver too old)", missing.join(", "))));
        }
        // SAFETY: the resource struct is plain data; zero is a valid starting value.
        let mut res: sys::CUdevResource = unsafe { std::mem::zeroed() };
        // SAFETY: valid device and out-pointer; entry point checked above.
        check("cuDeviceGetDevResource", unsafe {
            sys::cuDeviceGetDevResource(self.handle, &mut res, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
        })?;
        // SAFETY: an SM-type resource's union holds `sm`.
        let sm = unsafe { res.__bindgen_anon_1.sm };
        Ok(SmPartitioning {
            sm_count: sm.smCount,
            min_partition: sm.minSmPartitionSize,
            alignment: sm.smCoscheduledAlignment,
        })
    }
}
