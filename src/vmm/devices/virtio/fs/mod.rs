//! virtio-fs: host directories shared read-only (in progress).
