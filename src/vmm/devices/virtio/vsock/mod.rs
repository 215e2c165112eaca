//! virtio-vsock: the guest's stream sockets to the host (in progress).
