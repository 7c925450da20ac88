#!/usr/bin/env bash
# CUDA toolkit fixes for FlashInfer JIT and Triton on Blackwell, run inside the image build.
#
#   cuda-toolkit.sh setup    make /usr/local/cuda a complete JIT toolkit (see below)
#   cuda-toolkit.sh verify   nvcc >= 12.9 guard + compile/assemble probes for $PROBE_ARCHS
#                            (default $FLASHINFER_CUDA_ARCH_LIST), e.g. "12.0f 10.3a"
#
# setup:
#  * toolkit: use the base image's toolkit (/usr/local/cuda, CUDA devel images) when it has nvcc;
#    otherwise (CUDA_FROM_WHEELS=auto|1) install NVIDIA's toolkit wheels (cuda-toolkit[nvcc,crt,
#    nvvm,cudart,cccl]==$CUDA_VERSION.*, which pins matching nvidia-* components) into $VENV and point
#    /usr/local/cuda at site-packages/nvidia/cu13. Wheel layouts lack lib64/, libcudart.so and a
#    libcuda link stub, which FlashInfer's link line (-L lib64 -L lib64/stubs -lcudart -lcuda)
#    needs: add lib64 -> lib, libcudart.so -> libcudart.so.<major>, and a stub libcuda.so
#    (soname libcuda.so.1; the real one comes from the driver at run time).
#  * curand: FlashInfer's JIT adds only $CUDA_HOME/include, and sampling.cuh includes curand.h.
#    If the toolkit has no curand headers (runtime images, partial installs) install the
#    nvidia-curand wheel and link its headers into $CUDA_HOME/include.
# verify (fails the build with one clear line):
#  * nvcc release >= 12.9 (compute_120f needs 12.9; compute_103a needs 12.9);
#  * curand.h / curand_kernel.h resolvable from $CUDA_HOME/include;
#  * a kernel including curand_kernel.h compiles for each target arch;
#  * ptxas (what Triton uses via TRITON_PTXAS_PATH) assembles for each target arch: Triton's
#    bundled ptxas may predate sm_103a, so the image points Triton at the toolkit's ptxas.
set -euo pipefail

CUDA_VERSION=${CUDA_VERSION:-13.0}
CUDA_FROM_WHEELS=${CUDA_FROM_WHEELS:-auto}
VENV=${VENV:-/opt/venv}
CUDA_LINK=${CUDA_ROOT:-/usr/local/cuda}  # the toolkit FlashInfer sees as $CUDA_HOME
MIN_NVCC=${MIN_NVCC:-12.9}

die() { printf 'cuda-toolkit: ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf 'cuda-toolkit: %s\n' "$*" >&2; }

ver_ge() { [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1) == "$2" ]]; }

site_packages() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

pip_install() { "$VENV/bin/pip" install --no-cache-dir -q "$@"; }

setup() {
  local major=${CUDA_VERSION%%.*} home
  if [[ -x $CUDA_LINK/bin/nvcc && $CUDA_FROM_WHEELS != 1 ]]; then
    home=$(readlink -f "$CUDA_LINK")
    log "using the base image's toolkit at $home"
  else
    [[ $CUDA_FROM_WHEELS != 0 ]] || die "no nvcc at $CUDA_LINK/bin/nvcc and CUDA_FROM_WHEELS=0: use a CUDA devel base image"
    log "base image has no toolkit; installing NVIDIA CUDA $CUDA_VERSION wheels"
    # NVIDIA's cuda-toolkit meta wheel pins mutually consistent component versions per CUDA release.
    pip_install "cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]==$CUDA_VERSION.*"
    home="$(site_packages)/nvidia/cu$major"
    [[ -x $home/bin/nvcc ]] || die "NVIDIA wheels installed but $home/bin/nvcc is missing"
    [[ -e $home/lib64 ]] || ln -s lib "$home/lib64"
    local rt
    rt=$(find "$home/lib" -maxdepth 1 -name 'libcudart.so.*' | sort | head -n1)
    [[ -n $rt ]] || die "no libcudart.so.* in $home/lib"
    [[ -e $home/lib/libcudart.so ]] || ln -s "$(basename "$rt")" "$home/lib/libcudart.so"
    if [[ ! -e $home/lib/stubs/libcuda.so ]]; then
      mkdir -p "$home/lib/stubs"
      printf 'void cuda_link_stub(void) {}\n' >/tmp/cuda_stub.c
      gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$home/lib/stubs/libcuda.so" /tmp/cuda_stub.c
      rm -f /tmp/cuda_stub.c
    fi
    rm -rf "$CUDA_LINK"
    ln -s "$home" "$CUDA_LINK"
  fi
  if [[ ! -f $CUDA_LINK/include/curand.h || ! -f $CUDA_LINK/include/curand_kernel.h ]]; then
    log "no curand headers in $CUDA_LINK/include; installing cuda-toolkit[curand]==$CUDA_VERSION.* (nvidia-curand)"
    pip_install "cuda-toolkit[curand]==$CUDA_VERSION.*"
    local inc
    inc="$(site_packages)/nvidia/cu$major/include"
    [[ -f $inc/curand.h ]] || inc="$(site_packages)/nvidia/curand/include"
    [[ -f $inc/curand.h ]] || die "nvidia-curand installed but curand.h not found"
    if [[ $(readlink -f "$inc") != $(readlink -f "$CUDA_LINK/include") ]]; then
      local h
      for h in "$inc"/curand*.h; do ln -sf "$h" "$CUDA_LINK/include/$(basename "$h")"; done
    fi
  fi
}

nvcc_release() { "$CUDA_LINK/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n1; }

# "12.0f 10.3a" -> "120f 103a"
sm_list() { local a; for a in ${PROBE_ARCHS:-${FLASHINFER_CUDA_ARCH_LIST:?set PROBE_ARCHS or FLASHINFER_CUDA_ARCH_LIST}}; do printf '%s ' "${a/./}"; done; }

verify() {
  [[ -x $CUDA_LINK/bin/nvcc ]] || die "no nvcc at $CUDA_LINK/bin/nvcc (base image without the expected toolchain)"
  local rel
  rel=$(nvcc_release)
  [[ -n $rel ]] || die "cannot read the nvcc release from '$CUDA_LINK/bin/nvcc --version'"
  ver_ge "$rel" "$MIN_NVCC" || die "nvcc $rel is too old: sm_120f (RTX PRO 6000) and sm_103a (B300) need nvcc >= $MIN_NVCC; use a CUDA >= $MIN_NVCC toolkit"
  for h in curand.h curand_kernel.h; do
    [[ -f $CUDA_LINK/include/$h ]] || die "$h is not in $CUDA_LINK/include: FlashInfer's JIT sampling module will fail"
  done
  [[ -x $CUDA_LINK/bin/ptxas ]] || die "no ptxas at $CUDA_LINK/bin/ptxas (Triton needs it for sm_103a)"
  local work sm
  work=$(mktemp -d)
  cat >"$work/probe.cu" <<'EOF'
#include <curand_kernel.h>
__global__ void probe(float *out, unsigned long long seed) {
  curandStatePhilox4_32_10_t st;
  curand_init(seed, threadIdx.x, 0, &st);
  out[threadIdx.x] = curand_uniform(&st);
}
EOF
  for sm in $(sm_list); do
    # The include path FlashInfer's JIT gives nvcc: -isystem $CUDA_HOME/include (nothing else for curand).
    "$CUDA_LINK/bin/nvcc" -isystem "$CUDA_LINK/include" -gencode="arch=compute_$sm,code=sm_$sm" \
      -c "$work/probe.cu" -o "$work/probe_$sm.o" ||
      die "nvcc $rel cannot compile a curand kernel for sm_$sm"
    "$CUDA_LINK/bin/nvcc" -isystem "$CUDA_LINK/include" -arch="compute_$sm" -ptx "$work/probe.cu" -o "$work/probe_$sm.ptx" ||
      die "nvcc $rel cannot emit PTX for compute_$sm"
    "$CUDA_LINK/bin/ptxas" -arch="sm_$sm" "$work/probe_$sm.ptx" -o "$work/probe_$sm.cubin" ||
      die "ptxas cannot assemble for sm_$sm (Triton would fail the same way)"
    log "sm_$sm: curand kernel compiled, PTX assembled by ptxas"
  done
  rm -rf "$work"
  log "nvcc $rel OK for: $(sm_list)"
}

case ${1:-} in
  setup) setup ;;
  verify) verify ;;
  *) die "usage: $0 setup|verify" ;;
esac
