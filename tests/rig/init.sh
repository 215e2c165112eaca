#!/bin/sh
# PID 1 of the rig's L1 (busybox). Stages report on ttyS1, the agent channel,
# as "rig-error <stage> <detail>" so the harness can name what failed.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
stty -F /dev/ttyS1 raw -echo
fail() {
    echo "rig-error $*" >/dev/ttyS1
    echo "rig-error $*"
    sleep 1
    poweroff -f
}
for m in $(cat /modules/order); do
    insmod "/modules/$m" || fail "module-load $m"
done
[ -e /dev/kvm ] || fail "module-load kvm_amd (no /dev/kvm; is svm in the L1 CPU model?)"

mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower ||
    fail "mount hostroot"
mount -t tmpfs -o mode=0755 upper /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot ||
    fail "mount overlay"
for d in proc sys dev tmp run rig; do mkdir -p "/newroot/$d"; done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount --move /dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 xfer /newroot/rig || fail "mount xfer"
# QEMU's user-mode network (10.0.2.0/24), so proxy tests can reach real
# registries through the host's connection.
ip link set lo up
if ip link set eth0 up 2>/dev/null; then
    ip addr add 10.0.2.15/24 dev eth0
    ip route add default via 10.0.2.2
    rm -f /newroot/etc/resolv.conf
    echo "nameserver 10.0.2.3" >/newroot/etc/resolv.conf
fi
cp /agent.sh /newroot/run/rig-agent.sh
umount /proc /sys
exec switch_root /newroot /bin/sh /run/rig-agent.sh
