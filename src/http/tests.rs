//! Router tests through `Router::oneshot`: no socket, no NVML.
