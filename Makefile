# lucebox: make setup | build PROFILE=… | build-all | test | run | clean
#
#   make setup                      # .venv with the package (editable) and the test extras
#   make build PROFILE=rtx3090-sm86 # cuda/**/*.cu → build/rtx3090-sm86/liblucebox.so (incremental)
#   make build                      # PROFILE matched from this machine's GPU
#   make build-all                  # every profile in profiles/
#   make test                       # the unit tests (CPU); gpu tests run where a GPU is
#   make run                        # the main job: $(RUN_CMD)
#
# The nvcc arch comes from the profile (profiles/<name>.yaml, build.arch) through
# `python -m lucebox_cli.config arch NAME`, which refuses an unknown profile and lists the known ones.

SHELL := /bin/bash
PY ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python3)
NVCC ?= $(or $(wildcard /usr/local/cuda/bin/nvcc),nvcc)
PROFILE ?=
BUILD_DIR ?= $(or $(LUCEBOX_BUILD_DIR),build)

# The main job (`make run`): Qwen3.5-0.8B on the GPU engine when a GPU is here, else on the CPU
# engine; scripts/run_main.sh explains the fallbacks (no weights and no network: a tiny random model).
RUN_PROMPT ?= The capital of France is
RUN_CMD ?= bash scripts/run_main.sh "$(RUN_PROMPT)"

# Two builds of one profile at once (tests, another shell) wait for each other instead of racing on objects.
LOCK := $(if $(shell command -v flock 2>/dev/null),flock,)

.PHONY: setup build build-all test run clean _lib FORCE

setup:
	python3 -m venv .venv
	.venv/bin/pip install -U pip
	# Pin the CPU build of torch (the test reference); an unpinned torch pulls a multi-GB CUDA build.
	.venv/bin/pip install 'torch==2.13.0'
	.venv/bin/pip install -e '.[test]'
	.venv/bin/pip install --no-deps dflash==0.1.0

# Resolve the profile (refusing unknown ones), read its arch, then build in a sub-make that knows both.
build:
	@prof=$$($(PY) -m lucebox_cli.config resolve '$(PROFILE)') || exit 2; \
	arch=$$($(PY) -m lucebox_cli.config arch "$$prof") || exit 2; \
	echo "lucebox: building $(BUILD_DIR)/$$prof/liblucebox.so for $$arch"; \
	mkdir -p '$(BUILD_DIR)/'"$$prof"; \
	$(LOCK) '$(BUILD_DIR)/'"$$prof"/.lock $(MAKE) --no-print-directory _lib PROFILE="$$prof" ARCH="$$arch" BUILD_DIR='$(BUILD_DIR)'

build-all:
	@names=$$($(PY) -m lucebox_cli.config names) || exit 2; \
	for p in $$names; do $(MAKE) --no-print-directory build PROFILE=$$p BUILD_DIR='$(BUILD_DIR)' || exit 1; done

test:
	$(PY) -m pytest -q tests

run:
	$(RUN_CMD)

clean:
	rm -rf $(BUILD_DIR)

# ---- the library (only reached through `build`, with PROFILE and ARCH set) ----------------------

ifneq ($(ARCH),)
OUT := $(BUILD_DIR)/$(PROFILE)
# Every .cu under cuda/: adding an op is adding a file.
SRCS := $(shell find cuda -name '*.cu' | LC_ALL=C sort)
OBJS := $(patsubst cuda/%.cu,$(OUT)/obj/%.o,$(SRCS))
NVCCFLAGS := -O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -lineinfo --expt-relaxed-constexpr \
	-arch=$(ARCH) -Icuda/include -Icuda/common
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

_lib: $(OUT)/liblucebox.so

# Static cudart: the .so needs only the driver (libcuda.so.1) at run time. -ldl: cuBLAS is dlopen()ed
# when present (cuda/core/cublas_rt.cu), never linked.
$(OUT)/liblucebox.so: $(OBJS)
	$(NVCC) -shared -cudart static -arch=$(ARCH) $^ -o $@.tmp -ldl
	mv -f $@.tmp $@

# Objects rebuild when their source or an included header changes (-MMD), or when the flags do.
$(OUT)/obj/%.o: cuda/%.cu $(OUT)/flags.stamp
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) $(EXTRA_FLAGS) -MMD -MP -c $< -o $@

# Only build_info carries the commit, so a new commit rebuilds one small file.
$(OUT)/obj/core/build_info.o: EXTRA_FLAGS = -DLB_GIT_COMMIT=$(GIT_COMMIT) -DLB_NVCC_ARCH=$(ARCH)
$(OUT)/obj/core/build_info.o: $(OUT)/commit.stamp

# Stamps are rewritten only when their content changes, so make sees a change only then.
$(OUT)/flags.stamp: FORCE
	@mkdir -p $(@D)
	@echo '$(NVCC) $(NVCCFLAGS)' | cmp -s - $@ || echo '$(NVCC) $(NVCCFLAGS)' > $@

$(OUT)/commit.stamp: FORCE
	@mkdir -p $(@D)
	@echo '$(GIT_COMMIT)' | cmp -s - $@ || echo '$(GIT_COMMIT)' > $@

-include $(OBJS:.o=.d)
else
_lib:
	@echo "use: make build PROFILE=<name>" >&2; exit 2
endif

FORCE:
