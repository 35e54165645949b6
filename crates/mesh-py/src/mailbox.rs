//! `Mailbox`'s Python methods: open a mailbox, list its channels, claim a channel's producer or consumer end.

use mesh_shm::Mailbox;
use pyo3::prelude::*;

use crate::bulk::PyCopyConfig;
use crate::consumer::PyConsumer;
use crate::errors::shm_err;
use crate::mapped::{PyChannelInfo, PyMailbox};
use crate::producer::PyProducer;

#[pymethods]
impl PyMailbox {
    /// Maps the mailbox at `path` after validating it (a file of another layout version is refused).
    #[staticmethod]
    fn open(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        Mailbox::open(&path).map(|inner| Self { inner }).map_err(|e| shm_err(py, e))
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.inner.path().to_path_buf()
    }

    /// The pid of the meshd serving this mailbox, as it recorded it (None: none recorded).
    #[getter]
    fn owner_pid(&self) -> Option<u32> {
        self.inner.owner_pid()
    }

    /// Every live channel.
    fn channels(&self, py: Python<'_>) -> PyResult<Vec<PyChannelInfo>> {
        let list = self.inner.channels().map_err(|e| shm_err(py, e))?;
        Ok(list.into_iter().map(PyChannelInfo::from).collect())
    }

    /// One channel by name.
    fn channel(&self, py: Python<'_>, name: &str) -> PyResult<PyChannelInfo> {
        self.inner.channel(name).map(PyChannelInfo::from).map_err(|e| shm_err(py, e))
    }

    /// Claims the producer end of channel `name`, whatever its protocol (`copy_config`: a bulk
    /// channel's copy settings; None: the Rust host end's choice by message size).
    #[pyo3(signature = (name, copy_config=None))]
    fn producer(
        &self,
        py: Python<'_>,
        name: &str,
        copy_config: Option<PyRef<'_, PyCopyConfig>>,
    ) -> PyResult<PyProducer> {
        PyProducer::new(py, self, name, copy_config)
    }

    /// Claims the consumer end of channel `name`, whatever its protocol.
    #[pyo3(signature = (name, copy_config=None))]
    fn consumer(
        &self,
        py: Python<'_>,
        name: &str,
        copy_config: Option<PyRef<'_, PyCopyConfig>>,
    ) -> PyResult<PyConsumer> {
        PyConsumer::new(py, self, name, copy_config)
    }

    fn __repr__(&self) -> String {
        format!("Mailbox({:?})", self.inner.path().display().to_string())
    }
}
