//! Python `bytes` filled in place: a receive writes straight into a new `bytes` object, and a sent buffer is read where it lies.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A new `bytes` of `size` bytes that `fill` writes; None (the object dropped) when it wrote nothing.
pub(crate) fn new_bytes<'py>(
    py: Python<'py>,
    size: usize,
    fill: impl FnOnce(&mut [u8]) -> PyResult<bool>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let mut got = false;
    let bytes = PyBytes::new_with(py, size, |out| {
        got = fill(out)?;
        Ok(())
    })?;
    Ok(got.then_some(bytes))
}

/// A Python object's bytes, held exported (so that a bytearray cannot be resized under us).
pub(crate) struct Bytes {
    pub(crate) buf: PyUntypedBuffer,
}

impl Bytes {
    /// Exports `obj`'s buffer; refuses one that is not C-contiguous, or (for `writable`) a read-only one.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Self> {
        let buf = PyUntypedBuffer::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err(format!(
                "{what}: the buffer is not C-contiguous (pass a contiguous copy, e.g. numpy.ascontiguousarray)"
            )));
        }
        if writable && buf.readonly() {
            return Err(PyBufferError::new_err(format!("{what}: the buffer is read-only")));
        }
        Ok(Self { buf })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        let len = self.buf.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the exported buffer is C-contiguous (checked in `get`), so its `len_bytes` bytes
        // start at `buf_ptr`, and stay valid while the export (held by `self`) lives. Python code
        // may still write them concurrently (as with any buffer handed to native code): the bytes
        // sent are then whatever was there, never memory outside the buffer.
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr().cast::<u8>(), len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.buf.len_bytes();
        if len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `get` checked the export writable, and `&mut self` keeps this
        // the only slice of it made here.
        unsafe { std::slice::from_raw_parts_mut(self.buf.buf_ptr().cast::<u8>(), len) }
    }
}
