#!/bin/sh
# Runs inside the debootstrapped root (chroot) to turn it into a sandbox host image:
# systemd as PID 1 without getty/udev, sshd with per-container host keys, an admin
# user `rigops` with passwordless sudo (like a cloud image's default user).
set -eu

# Units that make no sense or hang in a container; timers that would grab the dpkg lock
# in the middle of a test run.
for unit in getty@.service console-getty.service serial-getty@.service \
    systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
    systemd-udev-trigger.service systemd-networkd-wait-online.service \
    apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service \
    e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "/etc/systemd/system/$unit"
done

# Host keys are made at a container's first boot, so every sandbox host has its own: one
# ed25519 key, the one the sandbox records (`ssh-keygen -A` would also make RSA 3072 and ECDSA
# keys, CPU spent at every boot for keys no one uses). sshd offers only that key (HostKey below).
rm -f /etc/ssh/ssh_host_*
cat > /etc/systemd/system/ssh-hostkeys.service <<'UNIT'
[Unit]
Description=Generate this host's SSH host keys on first boot
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/ssh-hostkeys.service \
  /etc/systemd/system/multi-user.target.wants/ssh-hostkeys.service

cat > /etc/ssh/sshd_config.d/rigops-sandbox.conf <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
CONF

useradd --create-home --shell /bin/bash --user-group rigops
install -d -m 0700 -o rigops -g rigops /home/rigops/.ssh
echo 'rigops ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/rigops
chmod 0440 /etc/sudoers.d/rigops

# What kmod creates on a real server (the sandbox's module tools are stand-ins laid down
# per host by its hardware profile, so kmod itself is not installed).
mkdir -p /etc/modprobe.d /etc/modules-load.d

# Keep the image small; hosts run `apt-get update` like any fresh machine. The lists
# folder is dated far in the past so that "update if older than N" treats it as stale.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
touch -d @0 /var/lib/apt/lists
: > /etc/machine-id
