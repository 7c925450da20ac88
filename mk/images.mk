# Images and the SGLang patch series (src/sglfleet/images/, src/sglfleet/patches/, docs/images.md).
#   make image TARGET=pcie|nvlink [PUSH=registry/repo] [RC=n] [PROFILE=production]   real build host
#   make image-ci                     CI proof: bootstrapped base, wheel toolkit, both targets
#   make patches-check                series vs pinned sglang from PyPI (zero fuzz) + drift report
#   make base-image                   local/bookworm-py:latest (mmdebstrap/debootstrap + docker import)
#   make services / services-stop     dockerd + registry on 127.0.0.1:5000 (scripts/services.sh)
.PHONY: image image-ci image-ci-shared image-ci-pcie image-ci-nvlink patches-check base-image services services-stop \
  lint-images test-images

TARGET ?=
PUSH ?=
RC ?=
PROFILE ?= production
IMAGE_CI_NAME ?= sglang-fleet-ci
IMAGE_CI_RC ?= 1
IMAGES_OUT ?= runs/images

image: ## [images] build the serving image: TARGET=pcie|nvlink [PUSH=registry/repo RC=n PROFILE=production]
	@if [ -z "$(TARGET)" ]; then echo "error: TARGET is required: make image TARGET=pcie|nvlink [PUSH=registry/repo]" >&2; exit 2; fi
	$(PY) -m sglfleet.images build --target "$(TARGET)" --profile "$(PROFILE)" $(if $(PUSH),--push "$(PUSH)") \
	  $(if $(RC),--rc $(RC)) --json $(IMAGES_OUT)/image-$(TARGET).json

# Targets CI builds (tests/images read the same variable from the environment). Default: both.
IMAGE_CI_TARGETS ?= pcie nvlink
export IMAGE_CI_TARGETS

image-ci: $(addprefix image-ci-,$(IMAGE_CI_TARGETS)) ## [ci] images: CI proof build on the bootstrapped base (no GPU, no CUDA base)

# The stages both targets share (toolchain + sglang + series), built once before the per-target JIT
# builds, which CI then runs in parallel (make -j2): FlashInfer's sampling.cu is one serial nvcc job
# per arch, so two targets side by side use both cores.
image-ci-shared: base-image
	$(PY) -m sglfleet.images build --profile ci --target pcie --build-target sglang --name $(IMAGE_CI_NAME)-shared $(IMAGE_CI_FLAGS) \
	  --rc $(IMAGE_CI_RC)

image-ci-pcie: base-image
	$(PY) -m sglfleet.images build --profile ci --target pcie --name $(IMAGE_CI_NAME) --rc $(IMAGE_CI_RC) \
	  --json $(IMAGES_OUT)/ci-pcie.json

# CI compiles the B300 arch only (10.3a); the production nvlink image also carries 10.0a.
image-ci-nvlink: base-image
	$(PY) -m sglfleet.images build --profile ci --target nvlink --arch-list 10.3a --name $(IMAGE_CI_NAME) \
	  --rc $(IMAGE_CI_RC) --json $(IMAGES_OUT)/ci-nvlink.json

patches-check: ## [patches] apply the sglang patch series to the pinned PyPI sources (zero fuzz) and report drift
	$(PY) -m sglfleet.patches check --json $(IMAGES_OUT)/patches-check.json

base-image: services ## [ci] bootstrap local/bookworm-py:latest (idempotent)
	scripts/base-image.sh

services: ## [ci] start dockerd + the loopback registry (idempotent)
	scripts/services.sh start docker registry

services-stop: ## [ci] stop dockerd + registry started by scripts/services.sh
	scripts/services.sh stop registry docker

lint-images: ## [ci] hadolint + ruff for the images, the patch tool and tests/images/
	$(VENV)/bin/hadolint src/sglfleet/images/Dockerfile
	$(VENV)/bin/ruff check src/sglfleet/images src/sglfleet/patches tests/images
	bash -n scripts/services.sh scripts/base-image.sh src/sglfleet/images/cuda-toolkit.sh .ci/stages/images.sh

test-images: ## [images] tests of this stage (docker-marked ones need `make image-ci` first)
	$(PY) -m pytest -q tests/images
