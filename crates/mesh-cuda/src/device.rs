//! A GPU as meshd sees it: name, UUID, SMs, compute capability and `sm_XY`, host-native atomics, MPS, SM partitioning;
//! a device chosen by ordinal or by UUID.

use crate::driver::{self, check, named};
use crate::error::CudaError;
use cudarc::driver::result;
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
        let fits = n >= self.min_partition && n.is_multiple_of(self.alignment.max(1)) && n <= self.sm_count;
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
        let count = result::device::get_count().map_err(named("cuDeviceGetCount"))?;
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!("device {ordinal} asked for, the driver sees {count}")));
        }
        let handle = result::device::get(ordinal).map_err(named("cuDeviceGet"))?;
        let name = result::device::get_name(handle).map_err(named("cuDeviceGetName"))?;
        let attr = |a: A| -> Result<i32, CudaError> {
            // SAFETY: a device the driver just returned.
            Ok(unsafe { result::device::get_attribute(handle, a) }.map_err(named("cuDeviceGetAttribute"))?)
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

    /// The device `selector` names: an ordinal (`1`, in the order the driver enumerates, which
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes `nvidia-smi -L`'s) or a UUID as `nvidia-smi -L` prints it
    /// (`GPU-5f3a…`, any case, a unique prefix of at least `GPU-` and 4 digits accepted), looked up
    /// among the visible devices with `cuDeviceGetUuid`.
    pub fn find(selector: &str) -> Result<Self, CudaError> {
        let selector = selector.trim();
        if let Ok(ordinal) = selector.parse::<i32>() {
            return Self::get(ordinal);
        }
        let Some(wanted) = normalize_uuid_prefix(selector) else {
            return Err(CudaError::NoDevice(format!(
                "{selector:?} is neither a device ordinal nor a GPU UUID (GPU-xxxxxxxx-…, as `nvidia-smi -L` prints)"
            )));
        };
        driver::init()?;
        let count = result::device::get_count().map_err(named("cuDeviceGetCount"))?;
        let mut seen = Vec::new();
        let mut found = Vec::new();
        for ordinal in 0..count {
            let device = Self::get(ordinal)?;
            let uuid = device.uuid()?;
            if uuid.starts_with(&wanted) {
                found.push(device);
            }
            seen.push(uuid);
        }
        match found.len() {
            1 => Ok(found.remove(0)),
            0 => Err(CudaError::NoDevice(format!("no visible GPU has UUID {selector} (visible: {})", seen.join(", ")))),
            n => Err(CudaError::NoDevice(format!("{selector} is a prefix of {n} GPUs' UUIDs: give more of it"))),
        }
    }

    /// `cuDeviceGetUuid`, formatted as `nvidia-smi -L` prints it: `GPU-` and 8-4-4-4-12 lowercase hex digits.
    pub fn uuid(&self) -> Result<String, CudaError> {
        // `cuDeviceGetUuid_v2`: what CUDA 13's header calls cuDeviceGetUuid (for a whole GPU the same UUID).
        if !driver::missing_symbols(&["cuDeviceGetUuid_v2"]).is_empty() {
            return Err(CudaError::NoDriver("libcuda lacks cuDeviceGetUuid_v2: the driver is too old".into()));
        }
        // cudarc's get_uuid calls it (its cuda-13000 feature); the entry point exists (checked above).
        let uuid = result::device::get_uuid(self.handle).map_err(named("cuDeviceGetUuid_v2"))?;
        Ok(format_uuid(&uuid.bytes.map(|b| b as u8)))
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

/// A UUID's 16 bytes as `nvidia-smi -L` prints them: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// `s` as the start of a GPU UUID in [`format_uuid`]'s form (`GPU-` prefix any case, hex lowercased),
/// or `None` when it is not one (`GPU-` then at least 4 hex digits and dashes, at most a whole UUID).
pub fn normalize_uuid_prefix(s: &str) -> Option<String> {
    let rest = s.get(..4).filter(|p| p.eq_ignore_ascii_case("GPU-")).map(|_| &s[4..])?;
    let digits = rest.chars().filter(char::is_ascii_hexdigit).count();
    let valid =
        rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-') && (4..=32).contains(&digits) && rest.len() <= 36;
    valid.then(|| format!("GPU-{}", rest.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvidia_smi_writes_them() {
        let bytes = [0x5f, 0x3a, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd];
        assert_eq!(format_uuid(&bytes), "GPU-5f3a0011-2233-4455-6677-8899aabbccdd");
        assert_eq!(
            normalize_uuid_prefix("gpu-5F3A0011-2233-4455-6677-8899AABBCCDD").as_deref(),
            Some("GPU-5f3a0011-2233-4455-6677-8899aabbccdd")
        );
        assert_eq!(normalize_uuid_prefix("GPU-5f3a").as_deref(), Some("GPU-5f3a"));
        for bad in ["0", "GPU-", "GPU-12", "MIG-5f3a0011", "GPU-zz3a0011", "GPU-5f3a0011-2233-4455-6677-8899aabbccdd00"]
        {
            assert_eq!(normalize_uuid_prefix(bad), None, "{bad}");
        }
    }
}
