# nabla: make | make test | make run | make bench | make bench-train | make install | make uninstall | make clean
CC      ?= cc
OPT     ?= -O3 -g
WARN    := -std=c11 -Wall -Wextra -Wpedantic
CFLAGS  += $(OPT) $(WARN) -D_POSIX_C_SOURCE=200809L -pthread
LIBFLAGS := -fPIC -fvisibility=hidden
LDLIBS  += -lm -lpthread
# GCC for s390x evaluates float expressions in double under -std=c11
# (FLT_EVAL_METHOD 1): a float scalar times a float vector is then a double
# converted to float lanes, an error. -fexcess-precision=fast rounds each
# float operation to float there (FLT_EVAL_METHOD 0, as on x86-64 and aarch64,
# and as -std=gnu11 does).
ifeq ($(shell printf '__FLT_EVAL_METHOD__\n' | $(CC) -std=c11 -E -P -x c - 2>/dev/null | tail -1),1)
CFLAGS  += -fexcess-precision=fast
endif
# make MPI=1: the examples built with Open MPI (their --dist flag), into build-mpi/
ifeq ($(MPI),1)
BUILD   ?= build-mpi
endif
BUILD   ?= build
# Every build uses all the CPUs unless the command line says -jN (make -j1:
# one at a time); the sub-makes of test, valgrind, asan and tsan inherit it
# (a sub-make reads MAKEFLAGS before its -j arrives: only the top level sets it).
NPROC   := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
MAKEFLAGS += -j$(NPROC)
endif

# Install locations (GNU style: files go to $(DESTDIR)$(LIBDIR) etc.).
PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig

# The version is written once, in nabla.h (NB_VERSION_MAJOR/MINOR/PATCH).
nb_version_part = $(shell awk '$$2 == "NB_VERSION_$(1)" {print $$3; exit}' nabla.h)
VERSION_MAJOR := $(call nb_version_part,MAJOR)
VERSION := $(VERSION_MAJOR).$(call nb_version_part,MINOR).$(call nb_version_part,PATCH)
ifneq ($(words $(subst ., ,$(VERSION))),3)
$(error could not read NB_VERSION_MAJOR/MINOR/PATCH from nabla.h (got "$(VERSION)"))
endif
# Programs record the soname and run against any library that has it:
# libnabla.so -> libnabla.so.ABI -> libnabla.so.MAJOR.MINOR.PATCH. ABI is the
# major version, or 0.MINOR while the major is 0: a 0.x minor version may
# change the ABI (an option struct grows), so a program built against 0.11
# never loads 0.12.
VERSION_ABI := $(if $(filter 0,$(VERSION_MAJOR)),0.$(call nb_version_part,MINOR),$(VERSION_MAJOR))
SONAME  := libnabla.so.$(VERSION_ABI)
SHLIB   := libnabla.so.$(VERSION)

LIB_SRC := $(wildcard tensor/*.c ops/*.c ops/arch/*/*.c autograd/*.c nn/*.c nn/*/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
HDRS    := nabla.h $(wildcard tensor/*.h ops/*.h ops/arch/*.h ops/arch/*/*.h autograd/*.h nn/*.h nn/*/*.h)
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
TEST_SRC := $(wildcard tests/*.c)
TEST_BIN := $(BUILD)/tests/run_tests

CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm)

.PHONY: all test run bench clean check-deps layers-check readme-check valgrind asan tsan error-table-check op-table callback-table install uninstall install-check resume-check \
  fuzz fuzz-build fuzz-load fuzz-ops fuzz-gpt fuzz-tokenizer fuzz-idx fuzz-regress fuzz-seeds fuzz-clean
# The top-level libnabla.a and libnabla.so point at build/ (README.md): only
# the default build sets them, not make mpi's build-mpi nor asan's, tsan's
# or any other BUILD.
all: $(BUILD)/libnabla.a $(BUILD)/libnabla.so $(EXAMPLES)
ifeq ($(BUILD),build)
	@ln -sf $(BUILD)/libnabla.a libnabla.a
	@ln -sf $(BUILD)/libnabla.so libnabla.so
endif

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) -c $< -o $@

# The GEMM kernel relies on multiply-adds contracting to FMA (-std=c11 turns
# contraction off in GCC); its AVX2/AVX-512 code comes from target attributes.
# Below -O2 (make asan's -O1) GCC contracts only some of them unless its
# widening-mul pass runs (-fexpensive-optimizations): the one-row kernels'
# explicit FMAs would then differ from the general kernel's bits.
$(BUILD)/ops/gemm.o: CFLAGS += -ffp-contract=fast $(if $(findstring clang,$(CC)),,-fexpensive-optimizations)
# The SVE micro-kernels are compiled for SVE (clang's arm_sve.h wants the
# target's flag, not an attribute); gemm.c calls them only where the CPU has
# SVE, and nothing else is in that file.
ifneq ($(filter aarch64%,$(shell $(CC) -dumpmachine 2>/dev/null)),)
$(BUILD)/ops/arch/arm/gemm_sve.o: CFLAGS += -march=armv8.2-a+sve
endif
# sqrtf inline (no errno), so that the optimizer loops vectorize
$(BUILD)/nn/train/optim.o: CFLAGS += -fno-math-errno

$(BUILD)/libnabla.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/$(SHLIB): $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS)

$(BUILD)/$(SONAME): $(BUILD)/$(SHLIB)
	ln -sf $(SHLIB) $@

$(BUILD)/libnabla.so: $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

EX_CC    = $(CC)
ifeq ($(MPI),1)
EX_CC    = $(MPICC)
EX_FLAGS = -DNB_MPI -Impi
EX_LIBS  = $(BUILD)/libnabla_mpi.a
endif
$(BUILD)/examples/%: examples/%.c $(wildcard examples/*.h) $(BUILD)/libnabla.a nabla.h $(EX_LIBS)
	@mkdir -p $(dir $@)
	$(EX_CC) $(CFLAGS) $(EX_FLAGS) -I. $< $(EX_LIBS) $(BUILD)/libnabla.a $(LDLIBS) -o $@

# Check is the one test dependency: installed here when missing and we are root.
check-deps:
	@if ! printf '#include <check.h>\n' | $(CC) -E -x c - >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make test: installing the Check library (apt-get install check)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq check pkg-config >/dev/null; \
	  else \
	    echo "make test needs the Check unit-test library. Install it with:"; \
	    echo "    sudo apt-get update && sudo apt-get install -y check pkg-config"; \
	    exit 1; \
	  fi; \
	fi

$(TEST_BIN): $(TEST_SRC) tests/test_util.h $(BUILD)/libnabla.a nabla.h | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $$(pkg-config --cflags check 2>/dev/null) -I. \
	  -DNB_FIXTURE_DIR='"$(CURDIR)/tests/fixtures"' $(TEST_SRC) $(BUILD)/libnabla.a \
	  $$(pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm) $(LDLIBS) -o $@

# After the suites, the op fuzzer's seed corpus replayed without libFuzzer
# (fuzz/replay.c): every call checked against its reference, and every op of
# ops/registry.h must have run successfully at least once.
test: check-deps
	@$(MAKE) --no-print-directory $(TEST_BIN) $(BUILD)/fuzz/replay $(BUILD)/examples/gpt \
	  $(BUILD)/examples/copy_task $(BUILD)/examples/newton $(BUILD)/examples/gradient_penalty $(BUILD)/examples/tokenize \
	  $(BUILD)/examples/fashion_mnist $(BUILD)/tests/gpt_sample_check $(BUILD)/examples/lstm_add $(BUILD)/tests/lstm_add_check \
	  $(BUILD)/tests/gen_gpt_files
	$(TEST_BIN)
	$(BUILD)/fuzz/replay fuzz/corpus/ops
	@bash tests/layers_check.sh $(BUILD)
	@sh tests/examples_check.sh $(BUILD)
	@sh tests/gpt_train_check.sh $(BUILD)
	@$(BUILD)/tests/gpt_sample_check $(BUILD)/examples/gpt tests/fixtures/gpt2/encoder.json $(BUILD)
	@$(BUILD)/tests/lstm_add_check $(BUILD)/examples/lstm_add tests/fixtures

# examples/gpt with GPT-2's tokenizer on a 1-layer model of GPT-2's vocabulary:
# samples text without training, tokenizes text for training, refuses what
# cannot be right (tests/tools/gpt_sample_check.c).
$(BUILD)/tests/gpt_sample_check: tests/tools/gpt_sample_check.c tests/tools/tool_check.h tests/gpt_files.h $(BUILD)/libnabla.a nabla.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. $< $(BUILD)/libnabla.a $(LDLIBS) -o $@

# examples/lstm_add against PyTorch: the same weights, batches and Adam give
# the same loss at each of 1000 steps, and the model learns to add
# (tests/tools/lstm_add_check.c, fixtures from tests/fixtures/gen_lstm_add.py).
$(BUILD)/tests/lstm_add_check: tests/tools/lstm_add_check.c tests/tools/tool_check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -lm -o $@

# make mutation-check [MUTANTS=name,...] [MUTATION_TIMEOUT=s]: how strong the
# tests are: each one-line mutant of tests/mutants.txt (a plausible bug) is
# applied to a scratch copy under build/mutation, built (-j2) and run against
# the suites; prints killed or SURVIVED per mutant and the score. Slow (about
# a minute a mutant); not part of make test or CI.
.PHONY: mutation-check
mutation-check: check-deps
	@MUTANTS="$(MUTANTS)" MUTATION_TIMEOUT="$(MUTATION_TIMEOUT)" bash tests/mutation_check.sh

# The library's folders form layers, tensor < autograd < ops < nn, none
# reaching up (by include or by symbol); make test runs this too.
layers-check: $(BUILD)/libnabla.a
	@bash tests/layers_check.sh $(BUILD)

$(BUILD)/fuzz/replay: fuzz/replay.c fuzz/fuzz_ops.c fuzz/ops_program.h ops/registry.h \
  ops/gemm_internal.h $(BUILD)/libnabla.a nabla.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. fuzz/replay.c fuzz/fuzz_ops.c $(BUILD)/libnabla.a $(LDLIBS) -o $@

run: all
	@if [ -x $(BUILD)/examples/copy_task ]; then $(BUILD)/examples/copy_task; else \
	  echo "make run: examples/copy_task.c is not built yet (see docs/api.md, 'What is not built yet')"; exit 1; fi

# make run-check: make run's last line must read exact match 100% (1000/1000)
# (the copy task, greedy-decoding 1,000 fresh sequences after training).
.PHONY: run-check
run-check: all
	@$(BUILD)/examples/copy_task > $(BUILD)/run-check.log && last=$$(tail -1 $(BUILD)/run-check.log) && \
	  if [ "$$last" = "exact match 100% (1000/1000)" ]; then \
	    echo "run-check: $$last ($$(grep '^held-out set' $(BUILD)/run-check.log | sed 's/.*; //'))"; \
	  else cat $(BUILD)/run-check.log; echo "run-check: the copy task ended on \"$$last\""; exit 1; fi

# make bf16-check: training in bf16 (autocast) against f32 on the examples:
# the copy task must still end on exact match 100% (1000/1000), and make gpt's
# run (char model, 1000 steps, --shuffle) must end within 2% of the f32 run's
# loss (the mean of the last 10 steps, which the example prints).
.PHONY: bf16-check
bf16-check: all
	@$(BUILD)/examples/copy_task --dtype bf16 > $(BUILD)/bf16-check.log && last=$$(tail -1 $(BUILD)/bf16-check.log) && \
	  if [ "$$last" = "exact match 100% (1000/1000)" ]; then echo "bf16-check: copy_task --dtype bf16: $$last"; \
	  else cat $(BUILD)/bf16-check.log; echo "bf16-check: copy_task --dtype bf16 ended on \"$$last\""; exit 1; fi
	@for d in f32 bf16; do $(BUILD)/examples/gpt --steps 1000 --shuffle --dtype $$d | \
	  sed -n 's/.*mean loss of the last 10 steps \([0-9.]*\).*/\1/p' > $(BUILD)/bf16-check.$$d || exit 1; done; \
	awk -v a="$$(cat $(BUILD)/bf16-check.f32)" -v b="$$(cat $(BUILD)/bf16-check.bf16)" 'BEGIN { \
	  r = (b - a) / a; if (r < 0) r = -r; ok = a != "" && b != "" && r <= 0.02; \
	  printf "bf16-check: gpt (char, 1000 steps): mean loss of the last 10 steps %s in f32, %s in bf16 " \
	  "(%.2f%% apart, at most 2%%): %s\n", a, b, 100 * r, ok ? "ok" : "FAIL"; exit !ok }'

# make test-isa: the kernels' suites again with the vector path capped by
# NABLA_ISA at each path below this CPU's best (the fallbacks every CPU may
# take); the suites that iterate paths themselves (gemm_bf16, bf16) check each.
ISA_SUITES ?= matmul bf16 attention nn threads
.PHONY: test-isa
test-isa: check-deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@best=$$(env -u NABLA_ISA NB_TEST_PRINT_ISA=1 $(TEST_BIN)); \
	for isa in portable avx2 avx512 avx512bf16 amx; do \
	  [ "$$isa" = "$$best" ] && break; \
	  for s in $(ISA_SUITES); do \
	    out=$$(NABLA_ISA=$$isa CK_RUN_SUITE=$$s CK_VERBOSITY=silent $(TEST_BIN) 2>&1); rc=$$?; \
	    [ $$rc = 0 ] || { echo "$$out"; echo "test-isa: suite $$s FAILED with NABLA_ISA=$$isa"; exit 1; }; \
	  done; echo "test-isa: suites $(ISA_SUITES) pass with NABLA_ISA=$$isa"; \
	done; echo "test-isa: this CPU's best path, $$best, is make test's"

# make test-s390x: nabla on a big-endian host (IBM Z, s390x) under QEMU's
# user-mode emulation: the library, examples and test binary cross-built by
# GCC into build-s390x/ (warnings are errors), then the suites that read or
# write files (each format's byte order is fixed whatever the host:
# nn/formats/byteorder_internal.h), the GEMM's and a few cheap ones, each
# with its time; then examples/tokenize must write "Hello world"'s llm.c
# token file byte for byte as on x86-64. The cross compiler,
# qemu-user-static and Check for s390x (Debian's multiarch check:s390x) are
# installed when missing and root, else the command is printed. About 4
# minutes on 2 cores (1 to build); S390X_SUITES="..." runs others.
S390X_CC     ?= s390x-linux-gnu-gcc
S390X_QEMU   ?= qemu-s390x-static
S390X_LIBDIR := /usr/lib/s390x-linux-gnu
S390X_OPT    ?= -O2 -Werror
S390X_SUITES ?= byteorder checkpoint gpt_io tokens idx tokenizer gpt_torch bf16 batchnorm conv_module \
                rnn matmul tensor autograd errors
.PHONY: test-s390x s390x-deps
s390x-deps:
	@if ! command -v $(S390X_CC) >/dev/null 2>&1 || ! command -v $(S390X_QEMU) >/dev/null 2>&1 || \
	  ! [ -e $(S390X_LIBDIR)/pkgconfig/check.pc ] || ! command -v pkg-config >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make test-s390x: installing gcc-s390x-linux-gnu, qemu-user-static and check:s390x"; \
	    dpkg --add-architecture s390x && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq gcc-s390x-linux-gnu qemu-user-static check:s390x pkg-config >/dev/null; \
	  else \
	    echo "make test-s390x needs a cross compiler, QEMU and Check for s390x. Install them with:"; \
	    echo "    sudo dpkg --add-architecture s390x && sudo apt-get update && \\"; \
	    echo "    sudo apt-get install -y gcc-s390x-linux-gnu qemu-user-static check:s390x pkg-config"; \
	    exit 1; \
	  fi; \
	fi

test-s390x: s390x-deps
	@t0=$$(date +%s); \
	PKG_CONFIG_LIBDIR=$(S390X_LIBDIR)/pkgconfig $(MAKE) --no-print-directory CC=$(S390X_CC) \
	  BUILD=build-s390x OPT="$(S390X_OPT)" all build-s390x/tests/run_tests || exit 1; \
	echo "test-s390x: built in $$(($$(date +%s) - t0)) s"; fail=0; \
	for s in $(S390X_SUITES); do t=$$(date +%s); \
	  out=$$(CK_RUN_SUITE=$$s $(S390X_QEMU) build-s390x/tests/run_tests 2>&1); rc=$$?; \
	  res=$$(printf '%s\n' "$$out" | grep -E '^[0-9]+%: Checks'); \
	  echo "test-s390x: $$s: $${res:-no result} ($$(($$(date +%s) - t)) s)"; \
	  [ $$rc = 0 ] || { printf '%s\n' "$$out" | grep -E ':[FE]:|qemu' | head -20; fail=1; }; \
	done; \
	f=build-s390x/tokens-check.bin; \
	printf 'Hello world' | $(S390X_QEMU) build-s390x/examples/tokenize \
	  --tokenizer tests/fixtures/gpt2/encoder.json --out $$f && \
	{ printf '\210\330\064\001\001\000\000\000\002\000\000\000'; head -c 1012 /dev/zero; \
	  printf '\210\074\343\003'; } | cmp -s - $$f && \
	echo "test-s390x: examples/tokenize --out: llm.c's token file, as x86-64 writes it" || \
	{ echo "test-s390x: examples/tokenize --out wrote other bytes than 20240520 1 2 (int32 LE)," \
	  "zeros to byte 1024, 15496 995 (uint16 LE)"; fail=1; }; \
	echo "test-s390x: $$([ $$fail = 0 ] && echo passed || echo FAILED) in $$(($$(date +%s) - t0)) s"; \
	exit $$fail

# make gpt: examples/gpt.c's character-level GPT (0.8M parameters) trained on
# examples/data/kjv.txt for 1000 steps (about 15 s on 2 cores), then a sample.
.PHONY: gpt
gpt: $(BUILD)/examples/gpt
	$(BUILD)/examples/gpt --steps 1000 --shuffle --sample 500

# make fashion [ARGS="--bn --epochs 3 --threads 2"]: examples/fashion_mnist.c
# trains Fashion-MNIST's "2 Conv+pooling" network (docs/fashion.md). The data
# is Debian's dataset-fashion-mnist (installed here when missing and we are
# root, as check-deps does for Check), gunzipped by the gzip tool into
# $(BUILD)/data/fashion-mnist (the library reads plain IDX files only).
FASHION_PKG  := /usr/share/datasets/fashion-mnist
FASHION_DATA := $(BUILD)/data/fashion-mnist
FASHION_IDX  := $(addprefix $(FASHION_DATA)/,train-images-idx3-ubyte train-labels-idx1-ubyte \
                  t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
.PHONY: fashion fashion-deps
fashion-deps:
	@if [ ! -f $(FASHION_PKG)/train-images-idx3-ubyte.gz ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make fashion: installing Fashion-MNIST (apt-get install dataset-fashion-mnist)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; \
	  else \
	    echo "make fashion needs Debian's Fashion-MNIST package. Install it with:"; \
	    echo "    sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist"; \
	    exit 1; \
	  fi; \
	fi
fashion: fashion-deps
	@$(MAKE) --no-print-directory $(BUILD)/examples/fashion_mnist $(FASHION_IDX)
	$(BUILD)/examples/fashion_mnist --data $(FASHION_DATA) --svg $(BUILD)/fashion_misclassified.svg $(ARGS)
$(FASHION_DATA)/%: $(FASHION_PKG)/%.gz
	@mkdir -p $(dir $@)
	gzip -dc $< > $@.tmp && mv $@.tmp $@

# Relinked every time, so that BLAS=1 and the default build never mix.
bench: all
	@if [ -f bench/bench.c ]; then rm -f $(BUILD)/bench/bench; \
	  $(MAKE) --no-print-directory $(BUILD)/bench/bench && $(BUILD)/bench/bench; else \
	  echo "make bench: bench/bench.c is not built yet (see docs/api.md, 'What is not built yet')"; exit 1; fi

# make bench-train: time to loss, nabla against PyTorch (when /usr/bin/python3
# imports torch; else the rows recorded in bench/torch_results.txt) on nanoGPT's
# CPU recipe and kjv.txt's bytes (bench/bench_train.sh, bench/torch_gpt_train.py).
# About 15 minutes; BENCH_TRAIN_STEPS=100 and BENCH_TRAIN_ROWS="nabla-f32-1
# torch-f32-1" make it short (docs/performance.md, "Time to loss").
.PHONY: bench-train
bench-train: all
	@$(MAKE) --no-print-directory $(BUILD)/bench/bench
	@sh bench/bench_train.sh $(BUILD)

# make bench BLAS=1: also OpenBLAS's sgemm beside nb_matmul (links only this binary).
$(BUILD)/bench/bench: bench/bench.c $(BUILD)/libnabla.a nabla.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. -DNB_BENCH_DIR='"$(CURDIR)/bench"' $(if $(filter 1,$(BLAS)),-DNB_BENCH_BLAS) \
	  $< $(BUILD)/libnabla.a $(if $(filter 1,$(BLAS)),-lopenblas) $(LDLIBS) -o $@

# make mca: the micro-kernels' inner loops (the LLVM-MCA-marked ones, ops/arch/mca.h)
# on CPU models we do not have: each marked source compiled to assembly with its
# object's flags and -DNB_MCA (aarch64 ones with the cross compiler), the
# regions through llvm-mca on aarch64 and x86-64 models, against each model's
# own FMA peak (bench/mca.sh; docs/performance.md, "Estimates for CPUs we do not
# have"). Times nothing. llvm-16 and gcc-aarch64-linux-gnu are installed when
# missing and we are root, as check-deps does for Check. MCA_CLANG=1: clang too.
MCA       ?= llvm-mca-16
MCA_CROSS ?= $(if $(filter aarch64%,$(shell $(CC) -dumpmachine 2>/dev/null)),$(CC),aarch64-linux-gnu-gcc)
.PHONY: mca mca-deps
mca-deps:
	@if ! command -v $(MCA) >/dev/null 2>&1 || \
	  ! printf '#include <stdlib.h>\n' | $(MCA_CROSS) -E -x c - >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make mca: installing llvm-16 and the aarch64 cross compiler (apt-get install llvm-16 gcc-aarch64-linux-gnu)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      llvm-16 gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; \
	  else \
	    echo "make mca needs $(MCA) (llvm-16) and $(MCA_CROSS). Install them with:"; \
	    echo "    sudo apt-get update && sudo apt-get install -y llvm-16 gcc-aarch64-linux-gnu libc6-dev-arm64-cross"; \
	    exit 1; \
	  fi; \
	fi
mca: mca-deps
	@MAKE="$(MAKE)" CC="$(CC)" MCA="$(MCA)" CROSS="$(MCA_CROSS)" MCA_CLANG="$(MCA_CLANG)" bash bench/mca.sh $(BUILD)

# make clean-clone-times [TIMES="run test gpt"]: the times README.md quotes,
# each command in a fresh clone of HEAD, build included (tests/clean_clone_times.sh).
TIMES ?= run test gpt
.PHONY: clean-clone-times
clean-clone-times:
	@sh tests/clean_clone_times.sh $(TIMES)

# The documentation still works: every C program of README.md and docs/*.md
# (a ```c block opening with "/* name.c:") compiled and run, its output
# compared with the ```text block after it; every "$ build/examples/..."
# ```text block run and compared; every relative link checked. The rules
# are in tests/readme_check.sh.
DOCS_MD = README.md $(sort $(wildcard docs/*.md))
readme-check: all
	@CC="$(CC)" CFLAGS="$(CFLAGS)" LDLIBS="$(LDLIBS)" sh tests/readme_check.sh $(BUILD) $(DOCS_MD)
	@grep -q '^y = 1.462196$$' $(BUILD)/readme/grad.out || { echo "readme-check: grad.c did not print y = 1.462196"; exit 1; }

# Stricter passes: the suites and examples under valgrind, and built with
# AddressSanitizer + UndefinedBehaviorSanitizer.
# Examples run there on a short setting (copy_task: one small epoch with every
# output option, then a second epoch resumed from its checkpoint).
SHORT_COPY = --batches 3 --d-model 32 --d-ff 64 --all-epochs --check 100
SHORT_ARGS = $$(case $$e in *copy_task) echo --epochs 1 $(SHORT_COPY) --save $(BUILD)/short.ckpt \
  --attn-map $(BUILD)/short-maps --loss-plot $(BUILD)/short-loss.svg;; \
  *gpt) echo --config tiny --steps 3 --batch 2 --seq 16 --shuffle --sample 16 --top-k 5 \
  --save $(BUILD)/short-gpt.ckpt --val-split 0.1 --eval-interval 2 --eval-iters 1 --grad-accum 2 \
  --save-best $(BUILD)/short-gpt-best.ckpt --lr-schedule cosine --warmup 1 --no-bias \
  --checkpoint-activations --dropout 0.1;; \
  *tokenize) echo --tokenizer tests/fixtures/gpt2/encoder.json --in README.md;; \
  *fashion_mnist) echo --data tests/fixtures/fashion-mini --epochs 1 --train-limit 8 --test-limit 8 \
  --batch 4 --bn --save $(BUILD)/short-fashion.ckpt --svg $(BUILD)/short-fashion.svg;; esac)
RESUME_SHORT = --epochs 2 $(SHORT_COPY) --load $(BUILD)/short.ckpt
VALGRIND := valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=1
# valgrind runs a process on one core at a time: the examples run beside the
# suites, on the other core.
valgrind: all check-deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@{ for e in $(EXAMPLES); do $(VALGRIND) $$e $(SHORT_ARGS) > /dev/null || exit 1; \
	    echo "valgrind clean: $$e"; done; \
	  $(VALGRIND) $(BUILD)/examples/copy_task $(RESUME_SHORT) > /dev/null && \
	    echo "valgrind clean: copy_task --load"; } > $(BUILD)/valgrind-examples.log 2>&1 & ex=$$!; \
	CK_FORK=no $(VALGRIND) $(TEST_BIN) > $(BUILD)/valgrind-tests.log 2>&1 || \
	  { tail -30 $(BUILD)/valgrind-tests.log; kill $$ex 2>/dev/null; exit 1; }; \
	tail -1 $(BUILD)/valgrind-tests.log; \
	wait $$ex || { cat $(BUILD)/valgrind-examples.log; exit 1; }; cat $(BUILD)/valgrind-examples.log

# make asan builds with $(CC) into build-asan; make asan CC=clang into
# build-asan-clang (CI runs both). The suites run without LeakSanitizer:
# Check forks a child per test, and LSan's exit scan in each child of the
# sanitized runner took 60% of the pass (320 s instead of 130 s); make
# valgrind checks the same suites for leaks, and the examples here keep LSan.
ASAN_BUILD = build-asan$(if $(findstring clang,$(CC)),-clang)
asan: check-deps
	@$(MAKE) --no-print-directory BUILD=$(ASAN_BUILD) OPT="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDLIBS="-fsanitize=address,undefined -lm -lpthread" $(ASAN_BUILD)/tests/run_tests all
	ASAN_OPTIONS=$${ASAN_OPTIONS:+$$ASAN_OPTIONS:}detect_leaks=0 $(ASAN_BUILD)/tests/run_tests
	@for e in $(EXAMPLES:$(BUILD)/%=$(ASAN_BUILD)/%); do $$e $(SHORT_ARGS) > /dev/null || exit 1; echo "asan ($(CC)) clean: $$e"; done
	@$(ASAN_BUILD)/examples/copy_task $(RESUME_SHORT) > /dev/null && echo "asan ($(CC)) clean: copy_task --load"

# ThreadSanitizer over the suites that run nabla on several threads at once
# (the pool, user threads, concurrent backward), into build-tsan.
TSAN_SUITES ?= threads concurrency registry callbacks conv
tsan: check-deps
	@$(MAKE) --no-print-directory BUILD=build-tsan OPT="-O1 -g -fsanitize=thread" \
	  LDLIBS="-fsanitize=thread -lm -lpthread" build-tsan/tests/run_tests
	@for s in $(TSAN_SUITES); do \
	  CK_FORK=no CK_RUN_SUITE=$$s TSAN_OPTIONS="halt_on_error=1 exitcode=66" \
	    build-tsan/tests/run_tests > build-tsan/tsan-$$s.log 2>&1 || { tail -40 build-tsan/tsan-$$s.log; exit 1; }; \
	  echo "tsan clean: suite $$s ($$(tail -1 build-tsan/tsan-$$s.log))"; done

# The op tables of docs/ops.md ("full") and README.md ("short") rewritten from
# ops/registry.h (the registry suite of make test fails when they differ).
op-table: check-deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@for fw in docs/ops.md:full README.md:short; do f=$${fw%%:*}; \
	  NB_TEST_PRINT_OP_TABLE=$${fw##*:} $(TEST_BIN) > $(BUILD)/op-table.md || exit 1; \
	  awk -v tf=$(BUILD)/op-table.md '/^<!-- op table: /{while ((getline l < tf) > 0) print l; skip=1; next} \
	    skip && /^<!-- end of op table -->/{skip=0; next} !skip' $$f > $(BUILD)/op-table.tmp && \
	  cp $(BUILD)/op-table.tmp $$f && echo "op table of $$f: made from ops/registry.h"; done

# The callback x misbehaviour table of docs/custom-functions.md rewritten
# from tests/test_callbacks.c (whose suite fails when they differ).
callback-table: check-deps
	@$(MAKE) --no-print-directory $(TEST_BIN)
	@NB_TEST_PRINT_CALLBACK_TABLE=1 $(TEST_BIN) > $(BUILD)/callback-table.md && \
	  awk -v tf=$(BUILD)/callback-table.md '/^<!-- callback table: /{print; while ((getline l < tf) > 0) print l; skip=1; next} \
	    skip && /^<!-- end of callback table -->/{skip=0} !skip' docs/custom-functions.md > $(BUILD)/callback-table.tmp && \
	  cp $(BUILD)/callback-table.tmp docs/custom-functions.md && echo "callback table of docs/custom-functions.md: made from tests/test_callbacks.c"

# The error tables of docs/errors.md ("Limits and errors") still match the sources.
error-table-check:
	@sh tests/error_table_check.sh docs/errors.md

# libFuzzer (results: docs/testing.md, "Fuzzing"): the harnesses in fuzz/ with the library compiled
# in, ASan + UBSan, under build-fuzz/. make fuzz runs each target for
# FUZZ_TIME seconds (NABLA_NUM_THREADS=1) on a copy of its seed corpus and
# prints a summary line; make fuzz-load / fuzz-ops / fuzz-gpt run one (make -j2 fuzz-load
# fuzz-ops runs two at once); FUZZ_ARGS adds libFuzzer options; make
# fuzz-regress replays fuzz/regressions/; make fuzz-seeds rewrites
# fuzz/corpus/ from fuzz/gen_seeds.c (which runs fuzz_ops.c to find each
# registered op's seed); make fuzz-clean removes build-fuzz/.
FUZZ_CC   ?= clang
FUZZ_TIME ?= 60
FUZZ_SAN  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_OPTS_load := -dict=fuzz/load.dict -max_len=4096
FUZZ_OPTS_ops  := -max_len=512
FUZZ_OPTS_gpt  := -dict=fuzz/load.dict -max_len=8192
FUZZ_OPTS_tokenizer := -dict=fuzz/tokenizer.dict -max_len=8192 -timeout=10
FUZZ_OPTS_idx  := -max_len=4096
fuzz: fuzz-build
	@rc=0; sh fuzz/run.sh load $(FUZZ_TIME) $(FUZZ_OPTS_load) $(FUZZ_ARGS) || rc=1; \
	  sh fuzz/run.sh ops $(FUZZ_TIME) $(FUZZ_OPTS_ops) $(FUZZ_ARGS) || rc=1; \
	  sh fuzz/run.sh gpt $(FUZZ_TIME) $(FUZZ_OPTS_gpt) $(FUZZ_ARGS) || rc=1; \
	  sh fuzz/run.sh tokenizer $(FUZZ_TIME) $(FUZZ_OPTS_tokenizer) $(FUZZ_ARGS) || rc=1; \
	  sh fuzz/run.sh idx $(FUZZ_TIME) $(FUZZ_OPTS_idx) $(FUZZ_ARGS) || rc=1; exit $$rc

fuzz-load fuzz-ops fuzz-gpt fuzz-tokenizer fuzz-idx: fuzz-%: fuzz-build
	@sh fuzz/run.sh $* $(FUZZ_TIME) $(FUZZ_OPTS_$*) $(FUZZ_ARGS)

fuzz-build:
	@printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
	  > /tmp/nabla-fuzz-probe-$$$$.c; \
	if ! $(FUZZ_CC) -fsanitize=fuzzer /tmp/nabla-fuzz-probe-$$$$.c -o /tmp/nabla-fuzz-probe-$$$$ 2>/dev/null; then \
	  rm -f /tmp/nabla-fuzz-probe-$$$$*; \
	  echo "make fuzz needs clang with the libFuzzer runtime ($(FUZZ_CC) -fsanitize=fuzzer does not link)."; \
	  echo "On Debian/Ubuntu with clang 14:  sudo apt-get install -y clang-14 libclang-rt-14-dev"; \
	  echo "(other versions: libclang-rt-N-dev; then make fuzz FUZZ_CC=clang-N)"; exit 1; fi; \
	rm -f /tmp/nabla-fuzz-probe-$$$$*
	@$(MAKE) --no-print-directory BUILD=build-fuzz CC=$(FUZZ_CC) \
	  OPT="-O1 -g -fsanitize=fuzzer-no-link $(FUZZ_SAN)" build-fuzz/libnabla.a
	@$(MAKE) --no-print-directory build-fuzz/fuzz_load build-fuzz/fuzz_ops build-fuzz/fuzz_gpt \
	  build-fuzz/fuzz_tokenizer build-fuzz/fuzz_idx

build-fuzz/fuzz_%: fuzz/fuzz_%.c $(wildcard fuzz/*.h) ops/registry.h build-fuzz/libnabla.a nabla.h
	$(FUZZ_CC) -O1 -g -fsanitize=fuzzer $(FUZZ_SAN) -std=c11 -Wall -Wextra -D_POSIX_C_SOURCE=200809L \
	  -I. $< build-fuzz/libnabla.a -lm -lpthread -o $@

fuzz-regress: fuzz-build
	@for t in load ops gpt tokenizer idx; do set -- fuzz/regressions/$$t/*; [ -e "$$1" ] || continue; \
	  NABLA_NUM_THREADS=1 build-fuzz/fuzz_$$t "$$@" > build-fuzz/regress_$$t.log 2>&1 || \
	  { tail -20 build-fuzz/regress_$$t.log; exit 1; }; echo "fuzz-regress: fuzz_$$t ran $$# inputs, clean"; done

fuzz-clean:
	rm -rf build-fuzz

fuzz-seeds:
	@mkdir -p build-fuzz
	$(CC) -O1 -g $(WARN) -D_POSIX_C_SOURCE=200809L -pthread -I. fuzz/gen_seeds.c fuzz/fuzz_ops.c \
	  $(LIB_SRC) $(LDLIBS) -o build-fuzz/gen_seeds
	rm -rf fuzz/corpus/load fuzz/corpus/ops && mkdir -p fuzz/corpus/load fuzz/corpus/ops && \
	  build-fuzz/gen_seeds fuzz/corpus/load fuzz/corpus/ops

# nabla.pc is generated at install time, as it records the install paths;
# inside it, paths under PREFIX are written relative to ${prefix}.
PC_SUBST = -e 's|@PREFIX@|$(PREFIX)|' \
  -e 's|@LIBDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))|' \
  -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))|' \
  -e 's|@VERSION@|$(VERSION)|'

# After installing into a system directory such as /usr/local/lib, run
# ldconfig once so the dynamic linker finds libnabla.so.MAJOR.
install: $(BUILD)/libnabla.a $(BUILD)/$(SHLIB)
	sed $(PC_SUBST) nabla.pc.in > $(BUILD)/nabla.pc
	install -d "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(PKGCONFIGDIR)"
	install -m 644 nabla.h "$(DESTDIR)$(INCLUDEDIR)/nabla.h"
	install -m 644 $(BUILD)/libnabla.a "$(DESTDIR)$(LIBDIR)/libnabla.a"
	install -m 755 $(BUILD)/$(SHLIB) "$(DESTDIR)$(LIBDIR)/$(SHLIB)"
	ln -sf $(SHLIB) "$(DESTDIR)$(LIBDIR)/$(SONAME)"
	ln -sf $(SONAME) "$(DESTDIR)$(LIBDIR)/libnabla.so"
	install -m 644 $(BUILD)/nabla.pc "$(DESTDIR)$(PKGCONFIGDIR)/nabla.pc"

# Removes the files install wrote; directories stay (as automake does), since
# they may have existed before (e.g. /usr/local/lib/pkgconfig).
uninstall:
	rm -f "$(DESTDIR)$(INCLUDEDIR)/nabla.h" "$(DESTDIR)$(PKGCONFIGDIR)/nabla.pc" \
	  "$(DESTDIR)$(LIBDIR)/libnabla.a" "$(DESTDIR)$(LIBDIR)/$(SHLIB)" \
	  "$(DESTDIR)$(LIBDIR)/$(SONAME)" "$(DESTDIR)$(LIBDIR)/libnabla.so"

# Installs into a temporary prefix, builds and runs a program against it
# through pkg-config (shared and static), then uninstalls.
install-check:
	MAKE="$(MAKE)" CC="$(CC)" ./tests/install_check.sh

# copy_task stopped after 2 epochs and resumed with --load ends with the very
# checkpoint bytes (weights, Adam state, random streams) of a run of 4 epochs;
# --anneal-at 0 starts annealing the learning rate after the first epoch, so
# the run stops in the middle of an annealing and resumes it. gpt likewise,
# without and with evaluations.
RESUME_ARGS = --d-model 32 --d-ff 64 --batches 5 --all-epochs --anneal 2 --anneal-at 0
GPT_RESUME = --config tiny --batch 4 --seq 16 --shuffle --dropout 0.1
# and with nanoGPT's flags: evaluations (at steps 0, 10, 20, ...: the half
# run stops at one), --save-best, micro-batches, a decay over all 40 steps
GPT_RESUME_EVAL = $(GPT_RESUME) --val-split 0.1 --eval-interval 10 --eval-iters 2 --grad-accum 2 \
  --lr-schedule cosine --warmup 5 --lr-decay-steps 40 --beta2 0.99 --decay-groups 2d --no-bias
resume-check: $(BUILD)/examples/copy_task $(BUILD)/examples/gpt
	@d=$$(mktemp -d) && trap 'rm -rf '$$d EXIT && \
	$(BUILD)/examples/copy_task $(RESUME_ARGS) --epochs 4 --save $$d/straight >/dev/null && \
	$(BUILD)/examples/copy_task $(RESUME_ARGS) --epochs 2 --save $$d/half >/dev/null && \
	$(BUILD)/examples/copy_task $(RESUME_ARGS) --epochs 4 --load $$d/half --save $$d/resumed >/dev/null && \
	cmp $$d/straight $$d/resumed && \
	echo "resume-check: 2 epochs + --load + 2 epochs = 4 epochs, checkpoints identical ($$(wc -c < $$d/resumed) bytes)" && \
	$(BUILD)/examples/gpt $(GPT_RESUME) --steps 40 --save $$d/g-straight >/dev/null && \
	$(BUILD)/examples/gpt $(GPT_RESUME) --steps 20 --save $$d/g-half >/dev/null && \
	$(BUILD)/examples/gpt $(GPT_RESUME) --steps 40 --load $$d/g-half --save $$d/g-resumed >/dev/null && \
	cmp $$d/g-straight $$d/g-resumed && \
	echo "resume-check: gpt 20 steps + --load + 20 steps = 40 steps, checkpoints identical ($$(wc -c < $$d/g-resumed) bytes)" && \
	$(BUILD)/examples/gpt $(GPT_RESUME_EVAL) --steps 40 --save $$d/e-straight --save-best $$d/e-best1 >/dev/null && \
	$(BUILD)/examples/gpt $(GPT_RESUME_EVAL) --steps 20 --save $$d/e-half --save-best $$d/e-best2 >/dev/null && \
	$(BUILD)/examples/gpt $(GPT_RESUME_EVAL) --steps 40 --load $$d/e-half --save $$d/e-resumed --save-best $$d/e-best2 >/dev/null && \
	cmp $$d/e-straight $$d/e-resumed && cmp $$d/e-best1 $$d/e-best2 && \
	echo "resume-check: gpt with evaluations, --save-best, --grad-accum 2, a cosine schedule: 20 + 20 steps = 40 steps, checkpoints and best checkpoints identical"

# make gpt-check: nabla's GPT-2 124M against PyTorch (tests/fixtures/gpt_torch.txt,
# from tests/fixtures/gen_gpt.py) on files that tests/gpt_files.h writes from a
# seed into $(BUILD)/gpt-check (llm.c checkpoint, Hugging Face safetensors,
# llm.c tokens; about 1 GB, no download): examples/gpt --eval --eval-iters 1 (the
# fixture's first batch) on either file,
# and one AdamW step (tests/tools/gpt_check.c), within 1e-4 relative; --eval
# with --dtype bf16 (autocast) within 1e-2 of PyTorch's f32 loss. 2.5 GB of
# RAM at its peak (one AdamW step of GPT-2 124M), one to two minutes on 2
# cores (docs/gpt.md). make gpt-fixture rewrites the fixture (Debian's python3-torch).
.PHONY: gpt-check gpt-fixture
GPT_FX := tests/fixtures/gpt_torch.txt
$(TEST_BIN): tests/gpt_files.h
$(BUILD)/tests/gen_gpt_files: tests/tools/gen_gpt_files.c tests/gpt_files.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@
$(BUILD)/tests/gpt_check: tests/tools/gpt_check.c tests/gpt_files.h $(BUILD)/libnabla.a nabla.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -I. $< $(BUILD)/libnabla.a $(LDLIBS) -o $@
gpt-check: $(BUILD)/tests/gen_gpt_files $(BUILD)/tests/gpt_check $(BUILD)/examples/gpt
	@d=$(BUILD)/gpt-check; t0=$$(date +%s); mkdir -p $$d && $(BUILD)/tests/gen_gpt_files gpt2 $$d > /dev/null && \
	want=$$(awk '$$1 == "config" {c = $$2} c == "gpt2" && $$1 == "loss_before" {print $$2}' $(GPT_FX)) && \
	rc=0 && for f in llmc.bin hf.safetensors; do \
	  got=$$($(BUILD)/examples/gpt --config gpt2 --init $$d/gpt2_$$f --data $$d/gpt2_tokens.bin \
	    --batch 4 --seq 64 --eval --eval-iters 1 | awk '$$1 == "loss" {print $$2}'); \
	  awk -v g="$$got" -v w="$$want" -v f="$$f" 'BEGIN {r = (g - w) / w; if (r < 0) r = -r; \
	    ok = g != "" && r <= 1e-4; printf "gpt-check: gpt2 examples/gpt --eval on gpt2_%s, batch 4x64: " \
	    "loss %s, torch %s (rel %.1e): %s\n", f, g == "" ? "(none)" : g, w, r, ok ? "ok" : "FAIL"; exit !ok}' || rc=1; \
	done; got=$$($(BUILD)/examples/gpt --config gpt2 --init $$d/gpt2_llmc.bin --data $$d/gpt2_tokens.bin \
	    --batch 4 --seq 64 --eval --eval-iters 1 --dtype bf16 | awk '$$1 == "loss" {print $$2}'); \
	awk -v g="$$got" -v w="$$want" 'BEGIN {d = g - w; if (d < 0) d = -d; ok = g != "" && d <= 1e-2; \
	  printf "gpt-check: gpt2 examples/gpt --eval --dtype bf16 on gpt2_llmc.bin, batch 4x64: loss %s, " \
	  "torch f32 %s (diff %.1e, at most 1e-2): %s\n", g == "" ? "(none)" : g, w, d, ok ? "ok" : "FAIL"; \
	  exit !ok}' || rc=1; \
	$(BUILD)/tests/gpt_check --config gpt2 --fixture $(GPT_FX) --llmc $$d/gpt2_llmc.bin \
	  --tokens $$d/gpt2_tokens.bin || rc=1; \
	echo "gpt-check: $$([ $$rc = 0 ] && echo all checks passed || echo FAILED) in $$(($$(date +%s) - t0)) s"; exit $$rc
gpt-fixture: $(BUILD)/tests/gen_gpt_files
	@mkdir -p $(BUILD)/gpt-check
	$(BUILD)/tests/gen_gpt_files small $(BUILD)/gpt-check && $(BUILD)/tests/gen_gpt_files gpt2 $(BUILD)/gpt-check
	/usr/bin/python3 tests/fixtures/gen_gpt.py --files $(BUILD)/gpt-check

# ------------------------------------------------------- aarch64 and riscv64
# make test-arm: the library, examples, test runner and op-fuzzer replay
# cross-compiled for aarch64 with -Werror by GCC (build-arm) and by clang
# --target=aarch64-linux-gnu (build-arm-clang: library, examples, runner),
# Check linked from Debian's arm64 multiarch libraries; then the suites under
# qemu-aarch64 user emulation, one run per aarch64 path (portable, neon,
# neon-bf16; sve at 16, 32 and 64-byte vectors) and on CPUs without SVE or
# BF16, where detection must fall back (tests/arm_check.sh, docs/testing.md).
# make test-riscv: the same -Werror build for riscv64 (GCC, build-riscv; the
# test sources compiled, not linked: Debian 12 has no Check for riscv64),
# then under qemu-riscv64 the op fuzzer's corpus (every op against its
# reference) and examples whose last line must match PyTorch's numbers.
# cross-deps installs what both need when missing and root (adding the arm64
# architecture to dpkg), or prints the commands.
ARM_CC     ?= aarch64-linux-gnu-gcc
ARM_CLANG  ?= clang --target=aarch64-linux-gnu
RISCV_CC   ?= riscv64-linux-gnu-gcc
CROSS_OPT  ?= -O3 -g -Werror
CROSS_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross gcc-riscv64-linux-gnu libc6-dev-riscv64-cross \
  qemu-user-static clang check:arm64 libsubunit-dev:arm64 check pkg-config
# Check's header is the host's (/usr/include, the same file on every
# architecture); a cross GCC does not look there otherwise.
CROSS_INC  := -idirafter /usr/include
# A build directory is built whole with -Werror: one made with other flags
# (make does not track them) is removed first.
cross_fresh = f="$(1) $(CROSS_OPT)"; [ "$$(cat $(2)/.cross-flags 2>/dev/null)" = "$$f" ] || \
  { rm -rf $(2); mkdir -p $(2); echo "$$f" > $(2)/.cross-flags; }
.PHONY: cross-deps test-arm test-riscv
cross-deps:
	@missing=; for c in aarch64-linux-gnu-gcc riscv64-linux-gnu-gcc qemu-aarch64-static qemu-riscv64-static clang; do \
	  command -v $$c >/dev/null 2>&1 || missing="$$missing $$c"; done; \
	[ -f /usr/lib/aarch64-linux-gnu/libcheck_pic.a ] || missing="$$missing check:arm64"; \
	[ -f /usr/lib/aarch64-linux-gnu/libsubunit.a ] || missing="$$missing libsubunit-dev:arm64"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make test-arm/test-riscv: installing the cross toolchains, QEMU and Check for arm64 (missing:$$missing)"; \
	    { dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64; } && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(CROSS_PKGS) >/dev/null; \
	  else \
	    echo "make test-arm and test-riscv need cross compilers, QEMU and Check for arm64 (missing:$$missing)."; \
	    echo "Install them with:"; \
	    echo "    sudo dpkg --add-architecture arm64 && sudo apt-get update && sudo apt-get install -y $(CROSS_PKGS)"; \
	    exit 1; \
	  fi; \
	fi

test-arm: cross-deps check-deps
	@t0=$$(date +%s); $(call cross_fresh,$(ARM_CC),build-arm); \
	PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig $(MAKE) --no-print-directory \
	  CC="$(ARM_CC) $(CROSS_INC)" BUILD=build-arm OPT="$(CROSS_OPT)" \
	  all build-arm/tests/run_tests build-arm/fuzz/replay > build-arm/build.log 2>&1 || \
	  { grep -E -A4 '(error|warning):' build-arm/build.log | head -60; echo "test-arm: $(ARM_CC) build FAILED"; exit 1; }; \
	echo "test-arm: build-arm: library, examples, tests and fuzz/replay built by $(ARM_CC) $(CROSS_OPT) in $$(($$(date +%s) - t0)) s"
	@t0=$$(date +%s); $(call cross_fresh,$(ARM_CLANG),build-arm-clang); \
	PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig $(MAKE) --no-print-directory \
	  CC="$(ARM_CLANG)" BUILD=build-arm-clang OPT="$(CROSS_OPT)" \
	  all build-arm-clang/tests/run_tests > build-arm-clang/build.log 2>&1 || \
	  { grep -E -A4 '(error|warning):' build-arm-clang/build.log | head -60; echo "test-arm: $(ARM_CLANG) build FAILED"; exit 1; }; \
	echo "test-arm: build-arm-clang: library, examples and tests built by $(ARM_CLANG) $(CROSS_OPT) in $$(($$(date +%s) - t0)) s"
	@bash tests/arm_check.sh build-arm build-arm-clang

RISCV_QEMU = qemu-riscv64-static -L /usr/riscv64-linux-gnu -E LD_LIBRARY_PATH=/usr/riscv64-linux-gnu/lib
test-riscv: cross-deps check-deps
	@t0=$$(date +%s); $(call cross_fresh,$(RISCV_CC),build-riscv); \
	$(MAKE) --no-print-directory CC="$(RISCV_CC)" BUILD=build-riscv OPT="$(CROSS_OPT)" \
	  all build-riscv/fuzz/replay > build-riscv/build.log 2>&1 && \
	mkdir -p build-riscv/tests-obj && cd build-riscv/tests-obj && \
	$(RISCV_CC) $(CROSS_OPT) $(WARN) -D_POSIX_C_SOURCE=200809L -pthread $(CROSS_INC) -I$(CURDIR) \
	  -DNB_FIXTURE_DIR='"$(CURDIR)/tests/fixtures"' -c $(addprefix $(CURDIR)/,$(TEST_SRC)) >> ../build.log 2>&1 || \
	  { cd $(CURDIR); grep -E -A4 '(error|warning):' build-riscv/build.log | head -60; echo "test-riscv: $(RISCV_CC) build FAILED"; exit 1; }; \
	echo "test-riscv: build-riscv: library, examples, fuzz/replay and the test sources built by $(RISCV_CC) $(CROSS_OPT) in $$(($$(date +%s) - t0)) s"
	@t0=$$(date +%s); fail=0; \
	$(RISCV_QEMU) build-riscv/fuzz/replay fuzz/corpus/ops > build-riscv/replay.log 2>&1 && \
	  echo "test-riscv: ok: $$(tail -1 build-riscv/replay.log)" || { tail -5 build-riscv/replay.log; fail=1; }; \
	for e in "newton:newton: converged to (1, 1) in 7 steps; Hv and the jvp agree with the references" \
	  "gradient_penalty:gradient_penalty: loss fell from 8.725266 to 1.957491 in 10 steps"; do \
	  last=$$($(RISCV_QEMU) build-riscv/examples/$${e%%:*} 2>&1 | tail -1); \
	  [ "$$last" = "$${e#*:}" ] && echo "test-riscv: ok: examples/$$last" || \
	    { echo "test-riscv: FAIL: examples/$${e%%:*} ended on \"$$last\""; fail=1; }; done; \
	got=$$(printf 'Hello, world<|endoftext|> caf\303\251\n' | \
	  $(RISCV_QEMU) build-riscv/examples/tokenize --tokenizer tests/fixtures/gpt2/encoder.json); \
	[ "$$got" = "15496 11 995 50256 40304 198" ] && echo "test-riscv: ok: examples/tokenize encodes GPT-2's ids" || \
	  { echo "test-riscv: FAIL: examples/tokenize gave \"$$got\""; fail=1; }; \
	echo "test-riscv: $$([ $$fail = 0 ] && echo "every check passed" || echo FAILED) under $(RISCV_QEMU) in $$(($$(date +%s) - t0)) s"; \
	exit $$fail

clean:
	rm -rf $(BUILD) build-asan build-asan-clang build-clang build-fuzz build-tsan build-arm build-arm-clang build-riscv build-s390x libnabla.a libnabla.so

# ------------------------------------------------------------- nabla_mpi
# The optional data-parallel part (mpi/nabla_mpi.h, docs/distributed.md):
# make mpi builds $(BUILD)/libnabla_mpi.a with Open MPI's mpicc; make
# test-mpi runs tests/mpi/test_mpi.c (Check, no fork) under mpirun on 2 and
# 4 ranks. Neither make, make test nor make run needs MPI. mpi-deps installs
# Debian's Open MPI when missing and root, or prints the command.
MPICC   ?= mpicc
MPIRUN  ?= mpirun --allow-run-as-root --oversubscribe
MPI_NP  ?= 2 4
.PHONY: mpi test-mpi test-mpi-net mpi-deps bench-mpi bench-mpi-net
mpi-deps:
	@if ! command -v $(MPICC) >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make mpi: installing Open MPI (apt-get install libopenmpi-dev openmpi-bin)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      libopenmpi-dev openmpi-bin >/dev/null; \
	  else \
	    echo "make mpi needs Open MPI. Install it with:"; \
	    echo "    sudo apt-get update && sudo apt-get install -y libopenmpi-dev openmpi-bin"; \
	    exit 1; \
	  fi; \
	fi

$(BUILD)/mpi/ddp.o: mpi/ddp.c mpi/nabla_mpi.h nabla.h | mpi-deps
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -I. -c $< -o $@

$(BUILD)/libnabla_mpi.a: $(BUILD)/mpi/ddp.o
	ar rcs $@ $^

# make mpi: the library (build/libnabla_mpi.a) and the examples with --dist
# (build-mpi/, as make MPI=1 builds them), all docs/distributed.md runs.
mpi: all mpi-deps
	@$(MAKE) --no-print-directory $(BUILD)/libnabla_mpi.a
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi all build-mpi/libnabla_mpi.a
	@echo "make mpi: $(BUILD)/libnabla_mpi.a (link with $(BUILD)/libnabla.a, $(MPICC)) and the" \
	  "examples with --dist in build-mpi/examples/, e.g.:"
	@if [ "$$(id -u)" = 0 ]; then \
	  echo "    mpirun --allow-run-as-root --oversubscribe -np 2 build-mpi/examples/copy_task --dist"; \
	  echo "(Open MPI refuses to run as root without --allow-run-as-root; as another user:" \
	    "mpirun -np 2 build-mpi/examples/copy_task --dist)"; \
	else echo "    mpirun -np 2 build-mpi/examples/copy_task --dist"; \
	  echo "(on fewer than 2 cores add --oversubscribe; as root add --allow-run-as-root too)"; fi

$(BUILD)/mpi/test_mpi: tests/mpi/test_mpi.c $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a | check-deps
	$(MPICC) $(CFLAGS) $$(pkg-config --cflags check 2>/dev/null) -I. -Impi $< \
	  $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a \
	  $$(pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm) $(LDLIBS) -o $@

$(BUILD)/mpi/fault: tests/mpi/fault.c $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a
	$(MPICC) $(CFLAGS) -I. -Impi $< $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a $(LDLIBS) -o $@

# The suites, then the fault cases (tests/mpi/fault_check.sh: a killed rank,
# a silent one), on each rank count of MPI_NP, then the examples' --dist
# (tests/mpi/examples_check.sh: 100%, resuming on the same and on other rank
# counts, --zero, failed loads and saves).
test-mpi: mpi check-deps
	@sh tests/mpi/make_mpi_check.sh "$(MAKE)" $(BUILD)
	@$(MAKE) --no-print-directory $(BUILD)/mpi/test_mpi $(BUILD)/mpi/fault
	@for n in $(MPI_NP); do echo "make test-mpi: $(MPIRUN) -np $$n $(BUILD)/mpi/test_mpi"; \
	  NABLA_NUM_THREADS=1 timeout 300 $(MPIRUN) -np $$n $(BUILD)/mpi/test_mpi || exit 1; done
	@sh tests/mpi/fault_check.sh $(BUILD) "$(MPIRUN)" $(MPI_NP)
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi build-mpi/examples/copy_task \
	  build-mpi/examples/gpt
	@RESUME_ARGS="$(RESUME_ARGS)" sh tests/mpi/examples_check.sh build-mpi "$(MPIRUN)"
	@bash tests/layers_check.sh $(BUILD)

# make test-mpi-net (root; otherwise it says so and skips): test_mpi with one
# rank per emulated host (a network namespace with a tbf-shaped veth into a
# bridge), over Open MPI's TCP path, on 2 and 4 hosts, gpt --dist against
# shared memory, a resume from 2 hosts to 4, and the faults of a network
# (a killed rank, a link taken down: $(BUILD)/mpi/fault train); everything
# it makes is torn down, also on failure or interrupt, and checked gone
# (tests/mpi/net_check.sh). In .ci/run (~70 s).
test-mpi-net: mpi check-deps
	@$(MAKE) --no-print-directory $(BUILD)/mpi/test_mpi $(BUILD)/mpi/fault
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi build-mpi/examples/gpt
	@sh tests/mpi/net_check.sh $(BUILD) "$(MPIRUN)" $(MPI_NP)

# build/mpi/net_relay (tests/mpi/net_relay.c): links with a delay without
# netem (issue 29), a user-space switch between TUN devices in network
# namespaces that holds each packet D us. Plain C, no MPI.
$(BUILD)/mpi/net_relay: tests/mpi/net_relay.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@

# make net-delay-check (root; otherwise it says so and skips): net_relay
# measured by tests/mpi/net_delay_check.sh with tests/mpi/net_probe.c (RTT
# at D = 0, 100, 1000 us; TCP one way and both ways through tbf at 1/10/25
# Gb/s and unshaped; the relay's CPU per GB; the veth + bridge path of
# make test-mpi-net beside it). Plain C, no MPI; about 3 minutes.
$(BUILD)/mpi/net_probe: tests/mpi/net_probe.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@

.PHONY: net-delay-check
net-delay-check: $(BUILD)/mpi/net_relay $(BUILD)/mpi/net_probe
	@sh tests/mpi/net_delay_check.sh $(BUILD)

# make asan-mpi: nabla_mpi, its suites and the examples' --dist under
# ASan/UBSan and LeakSanitizer, on make asan's objects (build-asan). What
# Open MPI allocates for the life of the process is suppressed
# (tests/mpi/lsan.supp); the slow unwinder finds its frames in libmpi and
# its plugins, so a leak of nabla_mpi, the tests or the examples still shows.
ASAN_MPI_OPT  = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
ASAN_MPI_LIBS = -fsanitize=address,undefined -lm -lpthread
ASAN_MPI_ENV  = NABLA_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/mpi/lsan.supp:print_suppressions=0
.PHONY: asan-mpi
asan-mpi: mpi-deps check-deps
	@$(MAKE) --no-print-directory BUILD=build-asan OPT="$(ASAN_MPI_OPT)" \
	  LDLIBS="$(ASAN_MPI_LIBS)" build-asan/mpi/test_mpi
	@for e in copy_task gpt; do $(MPICC) $(WARN) $(ASAN_MPI_OPT) -D_POSIX_C_SOURCE=200809L -pthread \
	  -DNB_MPI -Impi -I. examples/$$e.c build-asan/libnabla_mpi.a build-asan/libnabla.a \
	  $(ASAN_MPI_LIBS) -o build-asan/mpi/$$e || exit 1; done
	@for n in $(MPI_NP); do $(ASAN_MPI_ENV) timeout 600 $(MPIRUN) -np $$n build-asan/mpi/test_mpi \
	  > build-asan/mpi/test-$$n.log 2>&1 || { tail -40 build-asan/mpi/test-$$n.log; exit 1; }; \
	  echo "asan-mpi clean: test_mpi on $$n ranks ($$(tail -1 build-asan/mpi/test-$$n.log))"; done
	@d=build-asan/mpi; for run in \
	  "copy_task --epochs 1 $(SHORT_COPY) --save $$d/copy.ckpt" \
	  "copy_task --epochs 2 $(SHORT_COPY) --load $$d/copy.ckpt" \
	  "gpt --config tiny --steps 3 --batch 2 --seq 16 --zero --save $$d/gpt.ckpt" \
	  "gpt --config tiny --steps 5 --batch 2 --seq 16 --zero --load $$d/gpt.ckpt --sample 8"; do \
	  $(ASAN_MPI_ENV) timeout 600 $(MPIRUN) -np 2 $$d/$$run --dist > $$d/example.log 2>&1 || \
	    { tail -40 $$d/example.log; echo "asan-mpi: $$run --dist failed"; exit 1; }; \
	  echo "asan-mpi clean: mpirun -np 2 $$run --dist"; done

# make bench-mpi: GPT-2 124M steps on 1 process x 1 and 2 threads and on 2
# processes x 1 thread, and the reduction between 2 processes
# (bench/bench_mpi.sh, bench/mpi_allreduce.c). It builds the examples with
# MPI into build-mpi/ (make MPI=1).
$(BUILD)/mpi/mpi_allreduce: bench/mpi_allreduce.c $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a
	$(MPICC) $(CFLAGS) -I. -Impi $< $(BUILD)/libnabla_mpi.a $(BUILD)/libnabla.a $(LDLIBS) -o $@

bench-mpi: mpi-deps
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi all build-mpi/libnabla_mpi.a build-mpi/mpi/mpi_allreduce
	@sh bench/bench_mpi.sh build-mpi "$(MPIRUN)"

# make bench-mpi-net (root; otherwise it says so and skips): GPT-2 124M
# data-parallel between 2 emulated hosts over TCP, links of 1, 10 and 25
# Gb/s with 0.1 and 1 ms delay (net_relay), beside shared memory and the
# model of docs/distributed.md (bench/bench_mpi_net.sh). About 10 minutes.
.PHONY: bench-mpi-net
bench-mpi-net: mpi-deps
	@$(MAKE) --no-print-directory MPI=1 BUILD=build-mpi all build-mpi/libnabla_mpi.a \
	  build-mpi/mpi/mpi_allreduce build-mpi/mpi/net_relay
	@RELAY=build-mpi/mpi/net_relay sh bench/bench_mpi_net.sh build-mpi "$(MPIRUN)"
