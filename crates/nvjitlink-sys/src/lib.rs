//! Raw bindings to libnvJitLink, loaded at run time: no link-time dependency, no panic when it is absent.
//!
//! Three layers, after cudarc's: [`NvJitLink`] holds the entry points (the `sys` layer), found once
//! per process by [`NvJitLink::get`]; its `unsafe` methods take a raw handle and return `Result`
//! (the `result` layer); [`Linker`] owns one handle, destroys it on drop, and makes every call safe
//! (the `safe` layer, what mesh-cuda's JIT uses).
//!
//! Where the library is looked for, in order: `MESH_NVJITLINK` (a file), `CUDA_HOME` and
//! `CUDA_PATH` (their `lib64`, `lib` and `targets/x86_64-linux/lib`), `/usr/local/cuda` and every
//! `/usr/local/cuda-*` likewise, then the loader's own path (`libnvJitLink.so`, `.so.13`, `.so.12`).
//!
//! `nvJitLink.h` makes every entry point but `nvJitLinkVersion` a static inline wrapper around a
//! versioned export (`__nvJitLinkCreate_13_0`); the library exports the names of every minor version
//! of its major. We ask the library its version and resolve `_{major}_{minor}` down to `_{major}_0`,
//! then the plain name.

use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `nvJitLinkHandle`.
pub type NvJitLinkHandle = *mut c_void;

/// `nvJitLinkResult` values.
pub mod result {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// An option was not recognised.
    pub const UNRECOGNIZED_OPTION: u32 = 1;
    /// No `-arch` given.
    pub const MISSING_ARCH: u32 = 2;
    /// An input was invalid.
    pub const INVALID_INPUT: u32 = 3;
    /// PTX failed to compile.
    pub const PTX_COMPILE: u32 = 4;
    /// NVVM (LTO) failed to compile.
    pub const NVVM_COMPILE: u32 = 5;
    /// Internal error.
    pub const INTERNAL: u32 = 6;

    /// A short name for a result code.
    pub fn name(code: u32) -> &'static str {
        match code {
            0 => "NVJITLINK_SUCCESS",
            1 => "NVJITLINK_ERROR_UNRECOGNIZED_OPTION",
            2 => "NVJITLINK_ERROR_MISSING_ARCH",
            3 => "NVJITLINK_ERROR_INVALID_INPUT",
            4 => "NVJITLINK_ERROR_PTX_COMPILE",
            5 => "NVJITLINK_ERROR_NVVM_COMPILE",
            6 => "NVJITLINK_ERROR_INTERNAL",
            7 => "NVJITLINK_ERROR_THREADPOOL",
            8 => "NVJITLINK_ERROR_UNRECOGNIZED_INPUT",
            9 => "NVJITLINK_ERROR_FINALIZE",
            10 => "NVJITLINK_ERROR_NULL_INPUT",
            11 => "NVJITLINK_ERROR_INCOMPATIBLE_OPTIONS",
            12 => "NVJITLINK_ERROR_INCORRECT_INPUT_TYPE",
            13 => "NVJITLINK_ERROR_ARCH_MISMATCH",
            14 => "NVJITLINK_ERROR_OUTDATED_LIBRARY",
            15 => "NVJITLINK_ERROR_MISSING_FATBIN",
            16 => "NVJITLINK_ERROR_UNRECOGNIZED_ARCH",
            17 => "NVJITLINK_ERROR_UNSUPPORTED_ARCH",
            18 => "NVJITLINK_ERROR_LTO_NOT_ENABLED",
            _ => "NVJITLINK_ERROR_UNKNOWN",
        }
    }
}

/// `nvJitLinkInputType` values.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputType {
    /// A cubin.
    Cubin = 1,
    /// PTX text.
    Ptx = 2,
    /// LTO-IR.
    LtoIr = 3,
    /// A fat binary.
    Fatbin = 4,
    /// A host object with embedded device code.
    Object = 5,
    /// A static library.
    Library = 6,
    /// Let the linker tell by the contents.
    Any = 10,
}

/// What can go wrong loading or calling libnvJitLink.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// No candidate file loaded.
    #[error("libnvJitLink not found; looked for: {}", looked.join(", "))]
    NotFound {
        /// Every path or name tried, with why it failed.
        looked: Vec<String>,
    },
    /// The library lacks an entry point.
    #[error("{library}: no entry point {symbol} (tried {})", tried.join(", "))]
    MissingSymbol {
        /// The file loaded.
        library: String,
        /// The function.
        symbol: &'static str,
        /// Names tried.
        tried: Vec<String>,
    },
    /// A call returned an error code.
    #[error("{call}: {} ({code})", result::name(*code))]
    Call {
        /// The function.
        call: &'static str,
        /// The nvJitLinkResult.
        code: u32,
    },
}

type CreateFn = unsafe extern "C" fn(*mut NvJitLinkHandle, u32, *const *const c_char) -> u32;
type DestroyFn = unsafe extern "C" fn(*mut NvJitLinkHandle) -> u32;
type AddDataFn = unsafe extern "C" fn(NvJitLinkHandle, u32, *const c_void, usize, *const c_char) -> u32;
type CompleteFn = unsafe extern "C" fn(NvJitLinkHandle) -> u32;
type SizeFn = unsafe extern "C" fn(NvJitLinkHandle, *mut usize) -> u32;
type BufFn = unsafe extern "C" fn(NvJitLinkHandle, *mut c_void) -> u32;
type VersionFn = unsafe extern "C" fn(*mut u32, *mut u32) -> u32;

/// The loaded library and its entry points.
#[derive(Debug)]
pub struct NvJitLink {
    _lib: libloading::Library,
    /// The file that was loaded.
    pub path: String,
    /// The library's (major, minor).
    pub version: (u32, u32),
    create: CreateFn,
    destroy: DestroyFn,
    add_data: AddDataFn,
    complete: CompleteFn,
    cubin_size: SizeFn,
    cubin: BufFn,
    error_log_size: SizeFn,
    error_log: BufFn,
    info_log_size: SizeFn,
    info_log: BufFn,
}

/// Candidate files, in the order they are tried.
pub fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("MESH_NVJITLINK") {
        out.push(PathBuf::from(p));
    }
    let mut roots: Vec<PathBuf> =
        ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    if let Ok(entries) = std::fs::read_dir("/usr/local") {
        let mut versioned: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("cuda-")))
            .collect();
        versioned.sort();
        versioned.reverse();
        roots.extend(versioned);
    }
    for root in roots {
        for dir in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            for name in ["libnvJitLink.so", "libnvJitLink.so.13", "libnvJitLink.so.12"] {
                out.push(root.join(dir).join(name));
            }
        }
    }
    for name in ["libnvJitLink.so", "libnvJitLink.so.13", "libnvJitLink.so.12"] {
        out.push(PathBuf::from(name));
    }
    out
}

impl NvJitLink {
    /// The process's library, loaded on first use; the same error on every call if it could not be.
    pub fn get() -> Result<&'static NvJitLink, Error> {
        static LIB: OnceLock<Result<NvJitLink, Error>> = OnceLock::new();
        LIB.get_or_init(|| Self::load_from(&candidates())).as_ref().map_err(Clone::clone)
    }

    /// Whether the library can be loaded.
    pub fn present() -> bool {
        Self::get().is_ok()
    }

    /// Loads the first candidate that opens and has every entry point.
    pub fn load_from(candidates: &[PathBuf]) -> Result<Self, Error> {
        let mut looked = Vec::new();
        for path in candidates {
            let is_file_path = path.components().count() > 1;
            if is_file_path && !path.exists() {
                looked.push(format!("{} (absent)", path.display()));
                continue;
            }
            // SAFETY: loading libnvJitLink runs its initialisers, which have no preconditions.
            match unsafe { libloading::Library::new(path) } {
                Ok(lib) => return Self::bind(lib, path),
                Err(e) => looked.push(format!("{} ({e})", path.display())),
            }
        }
        Err(Error::NotFound { looked })
    }

    fn bind(lib: libloading::Library, path: &Path) -> Result<Self, Error> {
        let library = path.display().to_string();
        // SAFETY: nvJitLinkVersion has this signature in every release of the library.
        let version_fn: VersionFn =
            unsafe { lib.get::<VersionFn>(b"nvJitLinkVersion\0") }.map(|s| *s).map_err(|_| Error::MissingSymbol {
                library: library.clone(),
                symbol: "nvJitLinkVersion",
                tried: vec!["nvJitLinkVersion".into()],
            })?;
        let (mut major, mut minor) = (0u32, 0u32);
        // SAFETY: two valid out-pointers.
        let code = unsafe { version_fn(&mut major, &mut minor) };
        if code != result::SUCCESS {
            return Err(Error::Call { call: "nvJitLinkVersion", code });
        }
        /// Resolves `name` as `__name_{major}_{m}` for m = minor..=0, then `name`.
        fn resolve<T: Copy>(
            lib: &libloading::Library,
            library: &str,
            name: &'static str,
            major: u32,
            minor: u32,
        ) -> Result<T, Error> {
            let mut tried: Vec<String> = (0..=minor).rev().map(|m| format!("__{name}_{major}_{m}")).collect();
            tried.push(name.to_string());
            for sym in &tried {
                let mut bytes = sym.clone().into_bytes();
                bytes.push(0);
                // SAFETY: the caller names the type of the entry point as nvJitLink.h declares it.
                if let Ok(f) = unsafe { lib.get::<T>(bytes.as_slice()) } {
                    return Ok(*f);
                }
            }
            Err(Error::MissingSymbol { library: library.to_string(), symbol: name, tried })
        }
        let r = |name| (name, major, minor);
        macro_rules! entry {
            ($name:literal) => {{
                let (n, ma, mi) = r($name);
                resolve(&lib, &library, n, ma, mi)?
            }};
        }
        Ok(Self {
            create: entry!("nvJitLinkCreate"),
            destroy: entry!("nvJitLinkDestroy"),
            add_data: entry!("nvJitLinkAddData"),
            complete: entry!("nvJitLinkComplete"),
            cubin_size: entry!("nvJitLinkGetLinkedCubinSize"),
            cubin: entry!("nvJitLinkGetLinkedCubin"),
            error_log_size: entry!("nvJitLinkGetErrorLogSize"),
            error_log: entry!("nvJitLinkGetErrorLog"),
            info_log_size: entry!("nvJitLinkGetInfoLogSize"),
            info_log: entry!("nvJitLinkGetInfoLog"),
            version: (major, minor),
            path: library,
            _lib: lib,
        })
    }

    fn check(call: &'static str, code: u32) -> Result<(), Error> {
        if code == result::SUCCESS { Ok(()) } else { Err(Error::Call { call, code }) }
    }

    /// `nvJitLinkCreate` with `options` (e.g. `-arch=sm_90`).
    ///
    /// # Safety
    /// The returned handle must be destroyed once with [`NvJitLink::destroy`] and used by one thread at a time.
    pub unsafe fn create(&self, options: &[&CStr]) -> Result<NvJitLinkHandle, Error> {
        let ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut handle: NvJitLinkHandle = std::ptr::null_mut();
        #[allow(clippy::cast_possible_truncation, reason = "a handful of link options")]
        let count = ptrs.len() as u32;
        // SAFETY: `ptrs` holds valid C strings for the call's duration; `handle` is a valid out-pointer.
        Self::check("nvJitLinkCreate", unsafe { (self.create)(&mut handle, count, ptrs.as_ptr()) })?;
        Ok(handle)
    }

    /// `nvJitLinkDestroy`.
    ///
    /// # Safety
    /// `handle` came from [`NvJitLink::create`] and is not used afterwards.
    pub unsafe fn destroy(&self, mut handle: NvJitLinkHandle) -> Result<(), Error> {
        // SAFETY: the caller passes a live handle.
        Self::check("nvJitLinkDestroy", unsafe { (self.destroy)(&mut handle) })
    }

    /// `nvJitLinkAddData`.
    ///
    /// # Safety
    /// `handle` is live.
    pub unsafe fn add_data(
        &self,
        handle: NvJitLinkHandle,
        kind: InputType,
        data: &[u8],
        name: &CStr,
    ) -> Result<(), Error> {
        // SAFETY: `data` and `name` are valid for the call; the linker copies what it keeps.
        Self::check("nvJitLinkAddData", unsafe {
            (self.add_data)(handle, kind as u32, data.as_ptr().cast(), data.len(), name.as_ptr())
        })
    }

    /// `nvJitLinkComplete`.
    ///
    /// # Safety
    /// `handle` is live.
    pub unsafe fn complete(&self, handle: NvJitLinkHandle) -> Result<(), Error> {
        // SAFETY: the caller passes a live handle.
        Self::check("nvJitLinkComplete", unsafe { (self.complete)(handle) })
    }

    /// `nvJitLinkGetLinkedCubin(Size)`: the linked cubin.
    ///
    /// # Safety
    /// `handle` is live and completed.
    pub unsafe fn linked_cubin(&self, handle: NvJitLinkHandle) -> Result<Vec<u8>, Error> {
        let mut size = 0usize;
        // SAFETY: valid out-pointer; live handle.
        Self::check("nvJitLinkGetLinkedCubinSize", unsafe { (self.cubin_size)(handle, &mut size) })?;
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds the size the library gave.
        Self::check("nvJitLinkGetLinkedCubin", unsafe { (self.cubin)(handle, buf.as_mut_ptr().cast()) })?;
        Ok(buf)
    }

    /// The error log (empty when there is none).
    ///
    /// # Safety
    /// `handle` is live.
    pub unsafe fn error_log(&self, handle: NvJitLinkHandle) -> String {
        // SAFETY: forwarded contract.
        unsafe { Self::log(handle, self.error_log_size, self.error_log) }
    }

    /// The info log (empty when there is none).
    ///
    /// # Safety
    /// `handle` is live.
    pub unsafe fn info_log(&self, handle: NvJitLinkHandle) -> String {
        // SAFETY: forwarded contract.
        unsafe { Self::log(handle, self.info_log_size, self.info_log) }
    }

    /// A linker created with `options` (e.g. `-arch=sm_90`), destroyed when dropped.
    pub fn linker(&self, options: &[&CStr]) -> Result<Linker<'_>, Error> {
        // SAFETY: the handle is owned by the `Linker`, which destroys it once (in Drop) and, holding
        // a raw pointer, is neither Send nor Sync: one thread uses it.
        let raw = unsafe { self.create(options) }?;
        Ok(Linker { lib: self, raw })
    }

    unsafe fn log(handle: NvJitLinkHandle, size_fn: SizeFn, log_fn: BufFn) -> String {
        let mut size = 0usize;
        // SAFETY: valid out-pointer; the caller passes a live handle.
        if unsafe { size_fn(handle, &mut size) } != result::SUCCESS || size == 0 {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds the size the library gave (NUL included).
        if unsafe { log_fn(handle, buf.as_mut_ptr().cast()) } != result::SUCCESS {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).trim_end().to_string()
    }
}

/// One nvJitLink handle: inputs added, linked, its cubin and logs read; destroyed on drop.
///
/// Not `Send` nor `Sync` (it holds the raw handle): nvJitLink asks that a handle be used by one
/// thread at a time, and the JIT creates, uses and drops each on its own thread.
#[derive(Debug)]
pub struct Linker<'l> {
    lib: &'l NvJitLink,
    raw: NvJitLinkHandle,
}

impl Linker<'_> {
    /// `nvJitLinkAddData`: one input, named `name` in the logs.
    pub fn add_data(&self, kind: InputType, data: &[u8], name: &CStr) -> Result<(), Error> {
        // SAFETY: `raw` is live until Drop.
        unsafe { self.lib.add_data(self.raw, kind, data, name) }
    }

    /// `nvJitLinkComplete`: links every input added.
    pub fn complete(&self) -> Result<(), Error> {
        // SAFETY: `raw` is live until Drop.
        unsafe { self.lib.complete(self.raw) }
    }

    /// The linked cubin (after [`Linker::complete`] succeeded).
    pub fn linked_cubin(&self) -> Result<Vec<u8>, Error> {
        // SAFETY: `raw` is live until Drop; nvJitLink answers an error for an incomplete link.
        unsafe { self.lib.linked_cubin(self.raw) }
    }

    /// The error log (empty when there is none).
    pub fn error_log(&self) -> String {
        // SAFETY: `raw` is live until Drop.
        unsafe { self.lib.error_log(self.raw) }
    }

    /// The info log (empty when there is none).
    pub fn info_log(&self) -> String {
        // SAFETY: `raw` is live until Drop.
        unsafe { self.lib.info_log(self.raw) }
    }
}

impl Drop for Linker<'_> {
    fn drop(&mut self) {
        // An error on destroy cannot be acted on (the handle is gone either way) and Drop must not panic.
        // SAFETY: created in `NvJitLink::linker`, destroyed once, here, and never used afterwards.
        let _ = unsafe { self.lib.destroy(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_library_names_every_place_looked() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("libnvJitLink.so");
        let not_a_lib = dir.path().join("fake.so");
        std::fs::write(&not_a_lib, b"not an ELF").unwrap();
        let err = NvJitLink::load_from(&[missing.clone(), not_a_lib.clone()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("{} (absent)", missing.display())), "{text}");
        assert!(text.contains(&not_a_lib.display().to_string()), "{text}");
    }

    #[test]
    fn candidates_honour_the_override_and_cuda_home_first() {
        // SAFETY: set_var in a test binary whose other tests read these only through `candidates`.
        unsafe { std::env::set_var("MESH_NVJITLINK", "/opt/x/libnvJitLink.so.99") };
        let c = candidates();
        assert_eq!(c[0], PathBuf::from("/opt/x/libnvJitLink.so.99"));
        assert!(c.iter().any(|p| p.ends_with("targets/x86_64-linux/lib/libnvJitLink.so")));
        assert_eq!(c.last().unwrap(), &PathBuf::from("libnvJitLink.so.12"));
    }

    #[test]
    fn result_codes_have_names() {
        assert_eq!(result::name(result::PTX_COMPILE), "NVJITLINK_ERROR_PTX_COMPILE");
        assert_eq!(
            Error::Call { call: "nvJitLinkComplete", code: 4 }.to_string(),
            "nvJitLinkComplete: NVJITLINK_ERROR_PTX_COMPILE (4)"
        );
    }
}
