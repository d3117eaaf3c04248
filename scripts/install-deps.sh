#!/usr/bin/env bash
# Installs the system packages Weir's demo and tests use, when missing.
# Debian/Ubuntu, as root. Go itself is expected on PATH.
set -euo pipefail

need=()
command -v nft >/dev/null || need+=(nftables)
command -v ip >/dev/null || need+=(iproute2)
command -v conntrack >/dev/null || need+=(conntrack)
command -v git >/dev/null || need+=(git)
# etcd for the real kube-apiserver the Kubernetes-source tests run against.
[ -x /usr/bin/etcd ] || need+=(etcd-server)
# etcdctl: the HA guide's backups, which its lab test follows.
command -v etcdctl >/dev/null || need+=(etcd-client)
# FRR: the real BGP router of the LB-tier lab tests.
[ -x /usr/lib/frr/bgpd ] || need+=(frr)
# BIRD 2: the second router implementation the BGP lab tests run against.
command -v bird >/dev/null || [ -x /usr/sbin/bird ] || need+=(bird2)
# promtool: the shipped alerts are checked against a lab's metrics.
command -v promtool >/dev/null || need+=(prometheus)
# The CA bundle deploy/container/build-images.sh copies into the images.
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# The cluster lab's nodes (test/kubecluster): a container runtime, its OCI
# runtime and the CNI plugins the kubelets' pods are wired with.
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/ptp ] || need+=(containernetworking-plugins)
# The userland of Kubernetes' e2e test images (test/kubecluster builds
# them from this machine's parts): BusyBox, curl, nc, ss and wget; and
# iptables, for the CNI portmap plugin (host ports) and an image's tools.
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v curl >/dev/null || need+=(curl)
command -v nc.openbsd >/dev/null || need+=(netcat-openbsd)
command -v ss >/dev/null || need+=(iproute2)
command -v wget >/dev/null || need+=(wget)
command -v iptables >/dev/null || need+=(iptables)

if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing ${need[*]}; run as root (or: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v go >/dev/null || { echo "install-deps: Go 1.26 is required on PATH" >&2; exit 1; }
