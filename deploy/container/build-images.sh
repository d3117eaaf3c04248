#!/usr/bin/env bash
# Builds the weir/weir-server and weir/weir-agent images the Kubernetes
# manifests run, without pulling any base image: registries are not
# reachable from where Weir is built, Debian's apt archive and the Go module
# proxy are. Each image is one layer assembled here: static Go binaries,
# plus, for the agent, the nft and conntrack the datapath runs, taken with
# every library ldd says they need from the Debian packages apt resolves.
#
# With a reachable Docker daemon the layers are imported with docker import;
# otherwise (or with --oci-dir) they are written as OCI image archives, which
# docker load, ctr images import, podman load and kind load image-archive
# all read. See deploy/container/README.md.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: deploy/container/build-images.sh [--tag TAG] [--out DIR] [--oci-dir DIR] [--rootfs-only]

  --tag TAG      image tag (default: latest)
  --out DIR      where the root filesystems are assembled and kept
                 (default: bin/images)
  --oci-dir DIR  write DIR/weir-server.tar and DIR/weir-agent.tar (OCI image
                 archives) instead of importing into Docker
  --rootfs-only  only assemble DIR/weir-server-rootfs and DIR/weir-agent-rootfs

VERSION (default: git describe) is stamped into the binaries; the images
are tagged weir/weir-server:TAG and weir/weir-agent:TAG.
EOF
}

die() {
  echo "build-images: $*" >&2
  exit 1
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=latest out="$repo/bin/images" oci_dir="" rootfs_only=false
while (($#)); do
  case $1 in
  --tag) (($# > 1)) || die "--tag needs a value"; tag=$2; shift 2 ;;
  --tag=*) tag=${1#*=}; shift ;;
  --out) (($# > 1)) || die "--out needs a value"; out=$2; shift 2 ;;
  --out=*) out=${1#*=}; shift ;;
  --oci-dir) (($# > 1)) || die "--oci-dir needs a value"; oci_dir=$2; shift 2 ;;
  --oci-dir=*) oci_dir=${1#*=}; shift ;;
  --rootfs-only) rootfs_only=true; shift ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
  esac
done
version=${VERSION:-$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)}
# Both go into JSON and -ldflags unquoted: keep them to safe characters.
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "bad tag: $tag"
[[ $version =~ ^[A-Za-z0-9_.+-]+$ ]] || die "bad VERSION: $version"
# One timestamp for every file and the image config: the same sources and
# packages give the same layer digest.
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

for tool in go apt-get apt-cache dpkg dpkg-deb ldd tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is required (Debian with Go on PATH)"
done
ca_bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s $ca_bundle ]] || die "$ca_bundle is missing: apt-get install ca-certificates"

# The Go and Debian architectures must agree: the agent's nft comes from
# the Debian packages of this machine's architecture.
deb_arch=$(dpkg --print-architecture)
case $deb_arch in
amd64 | arm64 | s390x | riscv64) go_arch=$deb_arch ;;
ppc64el) go_arch=ppc64le ;;
*) die "unsupported architecture $deb_arch" ;;
esac

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/weir-images.XXXXXX")
trap 'rm -rf "$work"' EXIT
# apt-get download, as root, downloads as user _apt, which must reach and
# write the folder.
chmod 755 "$work"

# --- binaries ---------------------------------------------------------------
echo "build-images: building $version for linux/$go_arch"
for pkg in server/cmd/weir-server agent/cmd/weir-agent lbctl; do
  (cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=$go_arch \
    go build -trimpath -ldflags "-X main.version=$version" -o "$work/bin/$(basename "$pkg")" "./$pkg")
done

# --- Debian packages for the agent -----------------------------------------
# nftables and conntrack, everything they depend on (the only packages that
# can hold their libraries), and netbase, which nftables recommends: nft
# reads protocol and service names from its /etc/protocols and
# /etc/services, and lists rules with them.
roots=(nftables conntrack netbase)
candidate() { apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }'; }
if [[ $(candidate nftables) == "" || $(candidate nftables) == "(none)" ]]; then
  ((EUID == 0)) || die "apt knows no nftables package: run apt-get update"
  apt-get update -qq
fi
mapfile -t packages < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${roots[@]}" | grep -v '^[ <]' | sort -u)
((${#packages[@]})) || die "apt-cache depends ${roots[*]} listed nothing"
# Pinned to exactly the versions apt resolves here, never fetched from
# anywhere but the machine's apt sources.
pinned=()
for p in "${packages[@]}"; do
  v=$(candidate "$p")
  [[ -n $v && $v != "(none)" ]] || die "apt has no candidate for $p"
  pinned+=("$p=$v")
done
mkdir -p "$work/debs" "$work/pkgs"
if ((EUID == 0)) && id _apt >/dev/null 2>&1; then chown _apt "$work/debs"; fi
echo "build-images: apt-get download ($(. /etc/os-release && echo "${VERSION_CODENAME:-$ID}")) ${pinned[*]}"
(cd "$work/debs" && apt-get download -qq "${pinned[@]}")
for deb in "$work"/debs/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  dpkg-deb -x "$deb" "$work/pkgs/$name"
  dpkg-deb -f "$deb" >"$work/pkgs/$name.control"
done

# owner PATH: the package whose files hold PATH (as seen in the image).
owner() {
  local d
  for d in "$work"/pkgs/*/; do
    if [[ -e $d$1 || -L $d$1 ]]; then
      basename "$d"
      return
    fi
  done
  return 1
}

declare -A used=()
# copy_in ROOTFS PATH: PATH from its package into ROOTFS, with every
# symlink on the way to the file (sonames are links to versioned files).
copy_in() {
  local rootfs=$1 p=$2 pkg src target
  [[ -e $rootfs$p || -L $rootfs$p ]] && return
  pkg=$(owner "$p") || die "no downloaded package has $p"
  used[$pkg]=1
  src=$work/pkgs/$pkg$p
  mkdir -p "$rootfs$(dirname "$p")"
  if [[ -L $src ]]; then
    target=$(readlink "$src")
    ln -s "$target" "$rootfs$p"
    [[ $target == /* ]] || target=$(dirname "$p")/$target
    copy_in "$rootfs" "$(realpath -ms "$target")"
  else
    cp -p "$src" "$rootfs$p"
  fi
}

# libs_of FILE LIBPATH: sets libs to the image paths of everything ldd says
# FILE loads, the dynamic loader included. A library not found, or found
# outside the downloaded packages, fails the build. ldd runs without the
# caller's LD_PRELOAD (stdbuf sets one), which it would list as a need.
libs_of() {
  local listing line path
  listing=$(env -u LD_PRELOAD LD_LIBRARY_PATH=$2 ldd "$1") || die "ldd $1 failed"
  libs=()
  while read -r line; do
    case $line in
    *"=> not found"*) die "ldd $1: $line" ;;
    *"=> /"*)
      path=${line#*=> }
      path=${path% (*}
      [[ $path == "$work/pkgs/"* ]] || die "ldd $1: $path is not from the downloaded packages"
      path=${path#"$work/pkgs/"}
      libs+=("/${path#*/}")
      ;;
    /*) libs+=("${line% (*}") ;; # the loader, named as the binary names it
    esac
  done <<<"$listing"
  ((${#libs[@]})) || die "ldd found no libraries for $1"
}

# --- root filesystems ------------------------------------------------------
# base ROOTFS: what both images hold besides their programs.
base() {
  local rootfs=$1
  rm -rf "$rootfs"
  mkdir -p "$rootfs"/{etc/ssl/certs,tmp,usr/local/bin,var/lib/weir}
  chmod 1777 "$rootfs/tmp"
  cp "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  # The server runs as weir (65532), the agent as root.
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'weir:x:65532:65532:weir:/var/lib/weir:/sbin/nologin' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'weir:x:65532:' >"$rootfs/etc/group"
}

server_root=$out/weir-server-rootfs
base "$server_root"
cp "$work/bin/weir-server" "$work/bin/lbctl" "$server_root/usr/local/bin/"

agent_root=$out/weir-agent-rootfs
base "$agent_root"
cp "$work/bin/weir-agent" "$agent_root/usr/local/bin/"
libpath=$(find "$work/pkgs" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u | paste -sd: -)
for prog in /usr/sbin/nft /usr/sbin/conntrack; do
  pkg=$(owner "$prog") || die "no downloaded package has $prog"
  copy_in "$agent_root" "$prog"
  libs_of "$work/pkgs/$pkg$prog" "$libpath"
  for lib in "${libs[@]}"; do copy_in "$agent_root" "$lib"; done
done
for f in /etc/protocols /etc/services; do copy_in "$agent_root" "$f"; done
# Check the result, not the staging area: every library must resolve
# inside the image.
rootlibs=$(find "$agent_root" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u | paste -sd: -)
for prog in /usr/sbin/nft /usr/sbin/conntrack; do
  env -u LD_PRELOAD LD_LIBRARY_PATH=$rootlibs ldd "$agent_root$prog" | awk -v r="$agent_root" \
    '/=>/ && (/not found/ || index($3, r) != 1) { print; bad = 1 } END { exit bad }' ||
    die "$prog needs libraries the image lacks"
done
# Licences, and a dpkg record per package (as distroless images keep) so
# that image scanners see the Debian versions inside.
mkdir -p "$agent_root/var/lib/dpkg/status.d"
for pkg in $(printf '%s\n' "${!used[@]}" | sort); do
  cp "$work/pkgs/$pkg.control" "$agent_root/var/lib/dpkg/status.d/$pkg"
  doc=$work/pkgs/$pkg/usr/share/doc/$pkg
  if [[ -L $doc ]]; then # e.g. libgcc-s1 -> gcc-12-base: that package's licence
    doc=$work/pkgs/$(readlink "$doc")/usr/share/doc/$(readlink "$doc")
  fi
  if [[ -f $doc/copyright ]]; then
    install -D -m 0644 "$doc/copyright" "$agent_root/usr/share/doc/$pkg/copyright"
  fi
  echo "build-images: agent holds $pkg $(awk '$1 == "Version:" { print $2 }' "$work/pkgs/$pkg.control")"
done

echo "build-images: $(du -sh "$server_root" | cut -f1) $server_root"
echo "build-images: $(du -sh "$agent_root" | cut -f1) $agent_root"
$rootfs_only && exit 0

# --- images ----------------------------------------------------------------
path_env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# layer ROOTFS USER TARFILE: the root filesystem as one layer: owned by
# root, the data folder by USER, every time stamp the same.
layer() {
  local opts=(--format=gnu --sort=name --numeric-owner --mtime="@$epoch")
  tar -C "$1" -cf "$3" "${opts[@]}" --owner=0 --group=0 --exclude=./var/lib/weir .
  tar -C "$1" -rf "$3" "${opts[@]}" --owner="${2%%:*}" --group="${2##*:}" --no-recursion ./var/lib/weir
}

# oci_archive NAME USER ENTRYPOINT LAYER ARCHIVE: an OCI image layout in one
# tar, with Docker's manifest.json beside it for older docker load.
oci_archive() {
  local name=$1 user=$2 entry=$3 layer_tar=$4 archive=$5
  local d=$work/oci-$name ldig lsize cdig csize mdig msize config manifest
  mkdir -p "$d/blobs/sha256"
  ldig=$(sha256sum "$layer_tar" | cut -d' ' -f1)
  lsize=$(stat -c %s "$layer_tar")
  cp "$layer_tar" "$d/blobs/sha256/$ldig"
  config=$(printf '{"created":"%s","architecture":"%s","os":"linux","config":{"User":"%s","Env":["%s"],"Entrypoint":["%s"],"Labels":{"org.opencontainers.image.version":"%s"}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"deploy/container/build-images.sh"}]}' \
    "$created" "$go_arch" "$user" "$path_env" "$entry" "$version" "$ldig" "$created")
  cdig=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  csize=${#config}
  printf '%s' "$config" >"$d/blobs/sha256/$cdig"
  manifest=$(printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%d}]}' \
    "$cdig" "$csize" "$ldig" "$lsize")
  mdig=$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)
  msize=${#manifest}
  printf '%s' "$manifest" >"$d/blobs/sha256/$mdig"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"io.containerd.image.name":"docker.io/weir/%s:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$mdig" "$msize" "$name" "$tag" "$tag" >"$d/index.json"
  printf '[{"Config":"blobs/sha256/%s","RepoTags":["weir/%s:%s"],"Layers":["blobs/sha256/%s"]}]' \
    "$cdig" "$name" "$tag" "$ldig" >"$d/manifest.json"
  tar -C "$d" -cf "$archive" --format=gnu --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    oci-layout index.json manifest.json blobs
}

use_docker=false
if [[ -z $oci_dir ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    use_docker=true
  else
    echo "build-images: no Docker daemon reachable: writing OCI archives to $out"
    oci_dir=$out
  fi
fi
if ! $use_docker; then
  mkdir -p "$oci_dir"
  oci_dir=$(cd "$oci_dir" && pwd)
fi

for name in weir-server weir-agent; do
  if [[ $name == weir-server ]]; then user=65532:65532; else user=0:0; fi
  entry=/usr/local/bin/$name
  layer "$out/$name-rootfs" "$user" "$work/$name-layer.tar"
  if $use_docker; then
    docker import \
      --change "ENTRYPOINT [\"$entry\"]" \
      --change "USER $user" \
      --change "ENV $path_env" \
      --change "LABEL org.opencontainers.image.version=$version" \
      "$work/$name-layer.tar" "weir/$name:$tag" >/dev/null
    echo "build-images: imported weir/$name:$tag"
  else
    oci_archive "$name" "$user" "$entry" "$work/$name-layer.tar" "$oci_dir/$name.tar"
    echo "build-images: wrote $oci_dir/$name.tar (weir/$name:$tag)"
  fi
done

if $use_docker; then
  cat <<EOF
Load them into a cluster's nodes, e.g.:
  docker save weir/weir-server:$tag weir/weir-agent:$tag | ssh NODE ctr -n k8s.io images import -
  kind load docker-image weir/weir-server:$tag weir/weir-agent:$tag
EOF
else
  cat <<EOF
Load them where they run, e.g.:
  docker load -i $oci_dir/weir-agent.tar
  ctr -n k8s.io images import $oci_dir/weir-agent.tar      (on each node)
  kind load image-archive $oci_dir/weir-agent.tar
and the same for $oci_dir/weir-server.tar.
EOF
fi
