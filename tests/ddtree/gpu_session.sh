#!/usr/bin/env bash
# The H200 session for DDTree on real SGLang, one step per device call (run from the repo root on the
# GPU machine; the machine keeps /tmp only while warm, so issue the calls back to back).
#
#   step      carry                                    what
#   install1  .carry/sglang/p1                         sglang 0.5.23 + wheels into /tmp/site
#   install2  .carry/sglang/p2                         p2's wheels, sitecustomize (../shared/gpu recipe)
#   install3  .carry/sglang/p3                         sgl-kernel 0.4.5, flashinfer (p2+p3 exceed one call's carry)
#   (the SmolLM2 GGUF rides in four pieces, .carry/gguf/p0..p3 from tests/ddtree/split_gguf.sh: p0..p2 with
#   install1..3, p3 with the step that first needs the target)
#   train     .carry/gguf/p3                           the drafter alone (TRAIN_ARGS below); drafter -> $OUT; after
#                                                      RESUME=1 (carrying .carry/drafter too) goes on training it;
#                                                      ANSWERS=N answers per prompt, SELF_ASKED=N prompts the target
#                                                      asks itself (a fresh drafter: their held-out split differs),
#                                                      e.g. SELF_ASKED=4800 STEPS=8000 TRAIN_S=540 TRAIN_LIMIT=585
#   drafter   .carry/drafter [.carry/jit]              a drafter an earlier call returned (and the corpora beside it,
#                                                      into /tmp/corpus for a later train), for gate30 / real /
#                                                      RESUME=1 train (and the JIT cache a matrix step returned)
#   matrix    .carry/gguf/p3 .carry/ddtree-srv         the full serve matrix (28 servers, two waves); warms
#                                                      the JIT caches for gate30
#   gate30    .carry/ddtree-srv                        issue 30: correct builds gated 10 times each, the mutant once
#   incident  .carry/ddtree-srv .carry/gate-py         the incident driver with the trained drafter, gated
#   sweep     .carry/gate-py                           make sweep's sglang kind: it starts the grid's servers
#                                                      (src/sglfleet/validation/grids/sglang-smollm2.yaml) and gates each
#   loadtest  .carry/locust-py .carry/gate-py          Locust capacity (--quick) on target-only and DDTree b16/k4
#   trainwarm .carry/gguf/p3 .carry/ddtree-srv .carry/src  issue 41: the drafter trained while the target-only server and
#                                                      three dummy-drafter candidates compile the JIT kernels
#                                                      (tests/ddtree/prodseq.py warm); drafter + fijit.tgz -> $OUT
#   prodseq   .carry/ddtree-srv .carry/src             issue 41 items 4/5 in the production sequence (prodseq.py
#                                                      gates): target-only server and 9 candidates; baseline file;
#                                                      target-only stopped; every candidate gated with --baseline
#                                                      FILE only. KEEP=1 leaves the candidates serving for the next
#                                                      prodseq call on the same warm machine, which goes on;
#                                                      PRODSEQ_OVERLAP=1 with PRODSEQ_OVERLAP_TREES=16:4,31:4 and
#                                                      PRODSEQ_OVERLAP_FAULTS=row_shift gates builds under the
#                                                      overlap scheduler (tests/ddtree/prodseq.py)
#   real      .carry/ddtree-srv [.carry/jit]           issue 39: the 135M target and drafter inflated to Llama-3-8B's
#                                                      cost, served and measured (bench/ddtree_real.py; REAL_ARGS
#                                                      adds the overlap-scheduler servers and the churn check)
#   kernel-level tree-verify proof (tests/ddtree/gpu_proof.sh; .carry/proof from tests/ddtree/make_proof_carry.sh),
#   on a machine of its own or after the steps above:
#   proof-setup  .carry/sglang/p1 .carry/proof          sglang unpacked as unpatched / patched / mutant + p1's wheels
#   proof-deps   .carry/sglang/p2                       p2's wheels (pydantic and the rest the test's conftest imports)
#   proof        .carry/proof                           Triton: patched, unpatched, mutant at once
#   proof-fi     .carry/sglang/p3 .carry/proof          FlashInfer (p3's fislim.tgz, JIT about 45 s): patched, unpatched
#
# Build the carries here first: bash ../shared/gpu/make-carry.sh; bash tests/ddtree/fit_carry.sh;
# bash tests/ddtree/make_server_carry.sh;
# bash tests/ddtree/make_gate_carry.sh; bash tests/ddtree/split_gguf.sh (before fit_carry.sh, which counts gguf/p0).
set -uo pipefail
step=${1:?step: install1|install2|install3|train|drafter|trainwarm|prodseq|real|gate30|seeded|matrix|incident|sweep|loadtest|proof-setup|proof-deps|proof|proof-fi}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# pieces of the SmolLM2 GGUF ride along with the install calls (tests/ddtree/split_gguf.sh): each call copies
# the ones it carries into /tmp/gguf, and the gate30 step joins them
mkdir -p /tmp/gguf
for f in .carry/gguf/p*/part*; do [ -f "$f" ] && cp "$f" /tmp/gguf/; done
[ -d .carry/gate-py ] && [ ! -d /tmp/gate-py ] && cp -r .carry/gate-py /tmp/gate-py
# FlashInfer's JIT modules an earlier machine built (the matrix step returns fijit.tgz; carry it as .carry/jit):
# a fresh machine's servers then start in about 80 s instead of about 320 s (2026-12-03)
# (a marker, not the folder: importing sglang in install3 already makes an empty /tmp/fijit, and the first guard,
# `[ ! -d /tmp/fijit ]`, skipped the unpacking so gate30's servers compiled again: up at 288 s, 2026-12-03)
if [ -f .carry/jit/fijit.tgz ] && [ ! -f /tmp/fijit/.from-carry ]; then
  tar -C /tmp -xzf .carry/jit/fijit.tgz && touch /tmp/fijit/.from-carry && echo "jit cache in"
fi
# Triton's compiled kernels likewise (triton.tgz, from a `real` step's jit_caches): on a fresh H100 (2026-12-07) the
# servers' CUDA-graph captures spent 82-88 s compiling the attention kernels, and the speculative servers waited
# 148 s more at DFLASH's sampling pre-warm for FlashInfer's JIT; on the same machine warm they were up in 69-75 s
if [ -f .carry/jit/triton.tgz ] && [ ! -f ~/.triton/.from-carry ]; then
  mkdir -p ~/.triton && tar -C ~/.triton -xzf .carry/jit/triton.tgz && touch ~/.triton/.from-carry &&
    echo "triton cache in"
fi
# src/sglfleet/ of one commit for prodseq's gates (tests/ddtree/prodseq.py SRC; built here with
#   mkdir -p .carry/src && git archive HEAD src/sglfleet | gzip > .carry/src/src.tgz &&
#   git rev-parse --short HEAD > .carry/src/COMMIT ), unpacked once per warm machine
if [ -f .carry/src/src.tgz ] && [ ! -f /tmp/prodseq-src/.done ]; then
  mkdir -p /tmp/prodseq-src && tar -C /tmp/prodseq-src -xzf .carry/src/src.tgz && cp .carry/src/COMMIT /tmp/prodseq-src/ &&
    touch /tmp/prodseq-src/.done && echo "validation src in: $(cat /tmp/prodseq-src/COMMIT)"
fi
if [ -f /tmp/prodseq-src/.done ]; then
  PRODSEQ_SRC=/tmp/prodseq-src PRODSEQ_COMMIT=$(cat /tmp/prodseq-src/COMMIT); export PRODSEQ_SRC PRODSEQ_COMMIT
fi
# the target converted from the GGUF pieces the calls brought, once per warm machine
ensure_target() {
  [ -f /tmp/smollm2/model.safetensors ] && return 0
  cat /tmp/gguf/part* > /tmp/gguf/smollm2.gguf && ls -l /tmp/gguf/smollm2.gguf &&
    PYTHONPATH=$PYTHONPATH:.:./src python3 -m testbed.models convert --gguf /tmp/gguf/smollm2.gguf --out /tmp/smollm2
}
# what the JIT compilers left on this machine (FlashInfer's modules, Triton's kernels), sized for a later carry
jit_caches() {
  du -sh /tmp/fijit ~/.triton/cache ~/.cache 2>/dev/null | tee "$OUT/jit-caches.txt"
  local kb; kb=$(du -sk /tmp/fijit 2>/dev/null | cut -f1)
  if [ -n "$kb" ] && [ "$kb" -lt 40000 ]; then tar -C /tmp -czf "$OUT/fijit.tgz" fijit; fi
  kb=$(du -sk ~/.triton/cache 2>/dev/null | cut -f1)
  if [ -n "$kb" ] && [ "$kb" -lt 60000 ]; then tar -C ~/.triton -czf "$OUT/triton.tgz" cache; fi
}
# the corpus the target writes for the drafter (2,400 answers of up to 256 tokens, seed 0: 146 s on the H100) is
# kept in the tree, xz-compressed (testbed/models/corpora/, written by the thirty-sixth session's trainwarm), so a
# fresh checkout's first training call trains from its first second; a carried .carry/drafter/corpus.pt wins, and
# another SEQS / MAXNEW makes train-drafter write its own
CORPUS_XZ=testbed/models/corpora/smollm2-2400x256-seed0.pt.xz
# the corpus file of this call's recipe (SEQS prompts, MAXNEW tokens, ANSWERS per prompt): corpus.pt for the
# default one, whose file the tree keeps; another recipe's is named after it, here and as .carry/drafter/NAME
# SELF_ASKED=N: N more prompts the target asks itself (train-drafter --self-asked), named -sN
ASKED_SFX=; [ "${SELF_ASKED:-0}" != 0 ] && ASKED_SFX=-s$SELF_ASKED
if [ "${SEQS:-2400}" = 2400 ] && [ "${MAXNEW:-256}" = 256 ] && [ "${ANSWERS:-1}" = 1 ] && [ -z "$ASKED_SFX" ]; then
  CORPUS_NAME=corpus.pt
else
  CORPUS_NAME=corpus-${SEQS:-2400}x${MAXNEW:-256}-a${ANSWERS:-1}$ASKED_SFX.pt
fi
CORPUS=/tmp/corpus/$CORPUS_NAME
# (had_corpus: set when a corpus was in place before training, so only one the call writes goes back to $OUT)
corpus_in() {
  mkdir -p /tmp/corpus
  if [ -f "$CORPUS" ]; then
    :
  elif [ -f ".carry/drafter/$CORPUS_NAME" ]; then
    cp ".carry/drafter/$CORPUS_NAME" /tmp/corpus/
  elif [ "$CORPUS_NAME" = corpus.pt ] && [ -f "$CORPUS_XZ" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$CORPUS_XZ" "$CORPUS.part" && mv "$CORPUS.part" "$CORPUS" && echo "corpus from the tree"
  fi
  had_corpus=; [ -f "$CORPUS" ] && had_corpus=1
  # ANSWERS > 1 with no corpus of that recipe yet: the one-answer corpus (from the carry or the tree) is its base,
  # so the target writes only the further answers (train-drafter --base-corpus)
  # (the base with the most answers wins: ANSWERS=3 keeps an a2 corpus this machine or the carry has; with
  # SELF_ASKED, the same recipe's with fewer answers, else the pool prompts' alone with at most ANSWERS)
  base_corpus=()
  if [ -z "$had_corpus" ] && { [ "${ANSWERS:-1}" -gt 1 ] || [ -n "$ASKED_SFX" ]; } && [ "${SEQS:-2400}" = 2400 ] &&
     [ "${MAXNEW:-256}" = 256 ]; then
    local a f names=() low=2
    # (a self-asked one-answer corpus is named after its recipe; the pool's one-answer corpus is corpus.pt, below)
    [ -n "$ASKED_SFX" ] && low=1
    for ((a = ${ANSWERS:-1} - 1; a >= low; a--)); do names+=("corpus-2400x256-a$a$ASKED_SFX.pt"); done
    if [ -n "$ASKED_SFX" ]; then
      for ((a = ${ANSWERS:-1}; a >= 2; a--)); do names+=("corpus-2400x256-a$a.pt"); done
    fi
    for n in ${names[@]+"${names[@]}"}; do
      for f in "/tmp/corpus/$n" ".carry/drafter/$n"; do
        [ -f "$f" ] && [ ${#base_corpus[@]} = 0 ] && base_corpus=(--base-corpus "$f")
      done
    done
    if [ ${#base_corpus[@]} -gt 0 ]; then
      :
    elif [ -f .carry/drafter/corpus.pt ]; then
      base_corpus=(--base-corpus .carry/drafter/corpus.pt)
    elif [ -f "$CORPUS_XZ" ]; then
      base_corpus=(--base-corpus "$CORPUS_XZ")
    fi
  fi
  return 0
}
# the drafter's training recipe, one for `train` and `trainwarm` (issue 39 item 2: 2,400 distinct prompts' target
# answers; 64 anchors of 8 sequences a step; --max-seconds in each step cuts the steps to what fits its call, and
# the cosine schedule follows the cut: the packed step took 15 ms alone on the H100 (bench/drafter_step.py,
# 2026-12-07; the per-sequence step before it 98 ms), and 25,000 steps took 403 s in a train call, so 60,000 planned
# leaves the cut to the deadline; the 2,400-answer corpus is learnt by heart well before that, so train-drafter
# returns the drafter at its lowest validation loss)
TRAIN_ARGS=(--target /tmp/smollm2 --out /tmp/smollm2-dflash --device cuda --layers "${LAYERS:-2}"
            --seqs "${SEQS:-2400}" --max-new "${MAXNEW:-256}" --answers-per-prompt "${ANSWERS:-1}" --self-asked "${SELF_ASKED:-0}" --steps "${STEPS:-60000}" --seqs-per-step "${SPS:-8}"
            --anchors "${ANCHORS:-64}" --gen-batch "${GENBATCH:-256}")
# STEPBENCH=1 (train, real): first the drafter's training step side by side, per sequence / packed / packed + TF32
# (bench/drafter_step.py, about 40 s alone on the GPU; leave it room: TRAIN_S=440 TRAIN_LIMIT=490, or a shorter
# real LIMIT)
step_bench() {
  [ -n "${STEPBENCH:-}" ] || return 0
  # (on the tracked corpus, read by the bench itself: the step's cost, whatever corpus the call trains on)
  PYTHONPATH=$PYTHONPATH:.:./src timeout 90 python3 bench/drafter_step.py --device cuda --target /tmp/smollm2 \
    --rounds 6 --out "$OUT/drafter-step.json" 2>&1 | tail -8
}
case $step in
  install1)
    S=/tmp/site; mkdir -p $S
    tar -C $S -xzf .carry/sglang/p1/sglang-slim.tgz &&
      python3 -m pip install -q --no-index --no-deps --no-compile --target $S .carry/sglang/p1/whl/*.whl ;;
  install2)
    # p2 + p3 (61 MB) and the working tree no longer fit one call's 64 MiB carry: p2 here, p3 in install3
    S=/tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $S \
      .carry/sglang/p2/whl/*.whl 2>&1 | grep -v "already exists" | tail -2
    cp .carry/sglang/p2/sitecustomize.py $S/ ;;
  install3)
    # the p3 half of .carry/sglang/p2/on-device.sh (sgl-kernel 0.4.5 as 0.4.9, flashinfer)
    S=/tmp/site; C=.carry/sglang
    rm -rf "$S"/sgl_kernel "$S"/sglang_kernel-*.dist-info
    tar -C "$S" -xzf "$C/p3/sgk45-slim.tgz" &&
      sed -i 's/^Version: 0.4.5$/Version: 0.4.9/' "$S"/sglang_kernel-0.4.5.dist-info/METADATA &&
      tar -C "$S" -xzf "$C/p3/fislim.tgz" && tar -C "$S" -xzf "$C/p3/fi-cutlass-inc.tgz" && touch "$S/.sgk45" || exit 1
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh && python3 -c "import sglang, sgl_kernel; print('sglang ok')" ;;
  train)
    # the drafter alone, in its own call: training beside the gates' servers does not fit one call on a fresh
    # machine (2026-12-03). Carry .carry/gguf/p3; gate30 then finds /tmp/smollm2-dflash. One sequence's forward
    # is about 17 ms whatever its anchors (1,500 steps of 8 sequences x 16 anchors took 204 s, 2026-12-04), so
    # a step takes 64 anchors of 8 sequences; --max-seconds cuts the steps to what fits the call.
    # RESUME=1 goes on training the drafter the `drafter` step brought or this call carries (.carry/drafter;
    # train-drafter --resume: device time comes in short calls, so the drafter's steps add up over sessions).
    # The corpus the target wrote rides along as .carry/drafter/corpus.pt, written by the first call that had
    # none (2,400 answers took 146 s on the H100, 2026-12-05). Beside four compiling servers (`trainwarm`,
    # 2026-12-05) a step of 64 anchors x 8 sequences took 0.38 s: 394 steps in 148 s, too few (loss 5.26).
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    corpus_in; more=(--corpus "$CORPUS" "${base_corpus[@]}")
    if [ -n "${RESUME:-}" ]; then
      parts=(/tmp/drafter-parts/drafter.tar.part-*); [ -e "${parts[0]}" ] || parts=(.carry/drafter/drafter.tar.part-*)
      rm -rf /tmp/drafter-prev && mkdir -p /tmp/drafter-prev &&
        cat "${parts[@]}" | tar -C /tmp/drafter-prev -xf - || { echo "no drafter" >&2; exit 2; }
      more+=(--resume /tmp/drafter-prev/smollm2-dflash)
    fi
    step_bench
    PYTHONPATH=$PYTHONPATH:.:./src timeout "${TRAIN_LIMIT:-560}" python3 -m testbed.models train-drafter \
      "${TRAIN_ARGS[@]}" "${more[@]}" --max-seconds "${TRAIN_S:-500}" > /tmp/train.log 2>&1
    rc=$?; echo "train rc=$rc" >> /tmp/train.log; tail -2 /tmp/train.log; cp /tmp/train.log "$OUT/"
    [ -n "$had_corpus" ] || cp "$CORPUS" "$OUT/" 2>/dev/null  # a corpus this call wrote
    # the drafter comes back for later sessions (carry it as .carry/drafter), its report as a raw for docs/results
    [ "$rc" = 0 ] && cp /tmp/smollm2-dflash/train.json "$OUT/drafter-train.json" &&
      tar -C /tmp -cf - smollm2-dflash | split -b 15m - "$OUT/drafter.tar.part-" ;;
  drafter)
    # a drafter an earlier call returned (drafter.tar.part-*), carried as .carry/drafter, for gate30 / real / train
    # and the corpora beside it, so that a later `train` (whose call carries the target's gguf/p3, too large to ride
    # with them) finds its recipe's corpus or base in /tmp/corpus (corpus_in): RESUME=1 on the drafter's own corpus,
    # or ANSWERS=2 SELF_ASKED=N on the self-asked one
    mkdir -p /tmp/drafter-parts /tmp/corpus && cp .carry/drafter/drafter.tar.part-* /tmp/drafter-parts/ &&
      { cp .carry/drafter/corpus*.pt /tmp/corpus/ 2>/dev/null || true; } && ls /tmp/drafter-parts /tmp/corpus ;;
  gate30)
    # issue 30 in one call: the correct b7/k4 and b16/k4 builds gated 10 times each and the mutant once,
    # against a baseline recorded while a drafter trains (carry .carry/gguf/p3 and .carry/ddtree-srv; the
    # install calls brought the other GGUF pieces and /tmp/gate-py)
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    wait=()
    if [ -f /tmp/smollm2-dflash/model.safetensors ]; then  # the `train` step's drafter, on this warm machine
      echo "drafter from an earlier call" >> /tmp/train.log
    elif ls /tmp/drafter-parts/drafter.tar.part-* >/dev/null 2>&1; then  # a drafter trained in an earlier call
      cat /tmp/drafter-parts/drafter.tar.part-* | tar -C /tmp -xf - && echo "drafter from the carry" > /tmp/train.log || exit 1
    else
      { PYTHONPATH=$PYTHONPATH:.:./src python3 -m testbed.models train-drafter --target /tmp/smollm2 --out /tmp/smollm2-dflash \
          --device cuda --layers 2 --seqs "${SEQS:-512}" --max-new "${MAXNEW:-256}" --steps "${STEPS:-1500}" > /tmp/train.log 2>&1
        echo "train rc=$?" >> /tmp/train.log; touch /tmp/drafter.done; } &
      wait=(--wait-drafter /tmp/drafter.done)
    fi
    timeout "${LIMIT:-575}" python3 tests/ddtree/incident.py --drafter /tmp/smollm2-dflash --deadline "${DEADLINE:-545}" \
      "${wait[@]}" --repeat "${REPEAT:-10}" --only "${ONLY:-patched-b7-k4,patched-b16-k4,mutant-b16-k4}"
    cp /tmp/train.log "$OUT/"
    [ -f "$OUT/baseline.json" ] && mkdir -p "$OUT/gates" && mv "$OUT/baseline.json" "$OUT/gates/"
    tar -C "$OUT" -czf "$OUT/gates.tgz" gates profiles 2>/dev/null; rm -rf "$OUT/gates" "$OUT/logs" "$OUT/profiles"
    if [ -f /tmp/smollm2-dflash/model.safetensors ]; then  # the drafter, for a later session's carry
      tar -C /tmp -cf - smollm2-dflash | split -b 15m - "$OUT/drafter.tar.part-"
    fi
    jit_caches ;;  # FlashInfer's modules the servers built, for a later session's .carry/jit
  trainwarm)
    # issue 41 (tests/ddtree/prodseq.py): the drafter trains while the target-only server and three candidates with a
    # dummy-weight drafter compile the JIT kernels, so that `prodseq` finds them compiled; after install1..3 (which
    # bring gguf p0..p2 and gate-py), carrying .carry/gguf/p3 and .carry/ddtree-srv
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    # TRAINER=recipe: bench/drafter_recipe.py trains VARIANTS (default uniform and decay+init) on one corpus, each
    # cut to VARIANT_S, and exports the best held-out one as the drafter; its raw JSON comes back in $OUT
    if [ "${TRAINER:-}" = recipe ]; then
      train_cmd=(python3 bench/drafter_recipe.py --target /tmp/smollm2 --device cuda --dtype bfloat16
                 --seqs "${SEQS:-2400}" --max-new "${MAXNEW:-256}" --gen-batch "${GENBATCH:-256}"
                 --steps "${STEPS:-3000}" --seqs-per-step "${SPS:-8}" --anchors "${ANCHORS:-64}" --lr 3e-4
                 --layers "${LAYERS:-2}" --seeds 0 --variants "${VARIANTS:-uniform,decay+init}"
                 --seconds-per-variant "${VARIANT_S:-190}" --export-best /tmp/smollm2-dflash
                 --out "$OUT/drafter-recipe.json")
    else
      # the corpus from the tree or the carry (corpus_in); one this call writes comes back too
      corpus_in
      train_cmd=(python3 -m testbed.models train-drafter "${TRAIN_ARGS[@]}" --corpus "$CORPUS" "${base_corpus[@]}"
                 --max-seconds "${TRAIN_S:-460}")
    fi
    { PYTHONPATH=$PYTHONPATH:.:./src timeout "${TRAIN_LIMIT:-520}" "${train_cmd[@]}" > /tmp/train.log 2>&1
      echo "train rc=$?" >> /tmp/train.log; } &
    train=$!
    timeout "${WARM_LIMIT:-480}" python3 tests/ddtree/prodseq.py warm --deadline "${WARM_DEADLINE:-400}" 2>&1 | tail -3
    wait $train
    tail -3 /tmp/train.log; cp /tmp/train.log "$OUT/"
    [ -n "${had_corpus:-}" ] || cp "$CORPUS" "$OUT/" 2>/dev/null
    if [ -f /tmp/smollm2-dflash/model.safetensors ]; then  # for a fresh machine: carry as .carry/drafter, step drafter
      cp /tmp/smollm2-dflash/train.json "$OUT/drafter-train.json" 2>/dev/null
      tar -C /tmp -cf - smollm2-dflash | split -b 15m - "$OUT/drafter.tar.part-"
    fi
    jit_caches ;;
  prodseq)
    # issue 41 items 4/5 (tests/ddtree/prodseq.py gates): on the machine `trainwarm` left warm (or after install1..3
    # and `drafter` on a fresh one, then carrying .carry/gguf/p3 too), carrying .carry/ddtree-srv. KEEP=1: the
    # candidates stay up for the next prodseq call, which goes on with the runs that have no verdict yet
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    if [ ! -f /tmp/smollm2-dflash/model.safetensors ]; then
      cat /tmp/drafter-parts/drafter.tar.part-* | tar -C /tmp -xf - || { echo "no drafter" >&2; exit 2; }
    fi
    # MIN_GATE_S: the seconds a gate needs before the deadline to be started (prodseq.py --min-gate-s, 250 by
    # default; 180 fits a last round on a warm H100, where 15 gates at once took about 163 s, 2026-12-07)
    keep=(); [ -n "${KEEP:-}" ] && keep=(--keep)
    timeout "${LIMIT:-575}" python3 tests/ddtree/prodseq.py gates --drafter /tmp/smollm2-dflash \
      --deadline "${DEADLINE:-545}" --workers "${WORKERS:-10}" --runs "${RUNS:-20}" --fault-runs "${FAULT_RUNS:-3}" \
      ${keep[@]+"${keep[@]}"} ${PRODSEQ_OVERLAP:+--overlap} ${MIN_GATE_S:+--min-gate-s "$MIN_GATE_S"} 2>&1 | tee "$OUT/prodseq.log" | tail -60 ;;
  real)
    # issue 39: SmolLM2-135M and its trained drafter inflated to Llama-3-8B's cost, served and measured
    # (bench/ddtree_real.py), carrying .carry/ddtree-srv after install1..3 and drafter (+ gguf/p3 on a machine
    # that has no /tmp/smollm2 yet). Servers a KEEP=1 prodseq call left up are stopped first.
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    pkill -f sglang.launch_server && sleep 8
    ensure_target || exit 1
    step_bench
    if [ ! -f /tmp/smollm2-dflash/model.safetensors ]; then
      cat /tmp/drafter-parts/drafter.tar.part-* | tar -C /tmp -xf - || { echo "no drafter" >&2; exit 2; }
    fi
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
    # REAL_ARGS: more of ddtree_real.py's options, e.g. "--overlap-budgets 16 --overlap-chain --no-small" (DDTree
    # and the chain under the overlap scheduler beside their twins, with the churn check); BUDGETS=, and
    # "--no-small --no-chain --overlap-budgets 8,16,31" measures only the overlap servers beside the target alone
    # shellcheck disable=SC2086
    timeout "${LIMIT:-560}" python3 bench/ddtree_real.py --deadline "${DEADLINE:-520}" ${BUDGETS+--budgets "$BUDGETS"} \
      ${REAL_ARGS:-} 2>&1 | tee "$OUT/ddtree-real.log" | tail -60
    jit_caches ;;  # FlashInfer's modules and Triton's kernels these servers built, for a later session's .carry/jit
  seeded)
    # tests/ddtree/seeded_identity.py: target-only, the correct DDTree b16/k4 and its step_shared_random fault, all
    # with --enable-deterministic-inference, the same seeded T>0 requests to each (carry .carry/gguf/p3 and
    # .carry/ddtree-srv after install1..3 and drafter)
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    if [ ! -f /tmp/smollm2-dflash/model.safetensors ]; then
      cat /tmp/drafter-parts/drafter.tar.part-* | tar -C /tmp -xf - || exit 1
    fi
    timeout "${LIMIT:-440}" python3 tests/ddtree/seeded_identity.py --drafter /tmp/smollm2-dflash --deadline "${DEADLINE:-420}"
    tar -C "$OUT" -czf "$OUT/seeded-logs.tgz" logs 2>/dev/null; rm -rf "$OUT/logs" ;;
  matrix)
    # the full serve matrix on the trained target; on a fresh machine its first wave (two servers) compiles the
    # JIT kernels the rest and a later gate30 then load: in 2026-12-03's gate30 the cold compiles held every
    # server 230 s (FlashInfer's modules are built once under a file lock: 85 s at the first graph capture,
    # 146 s at DFLASH's sampling pre-warm), so this step before gate30 leaves gate30 its time for the gates.
    # Carry .carry/gguf/p3 (with p0..p2 from the installs) and .carry/ddtree-srv.
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    ensure_target || exit 1
    # ONLY=overlap: DDTree b7/b16/b31 under the overlap scheduler beside their non-overlap twins and an overlap
    # mutant (serve_matrix.py plan "overlap"); with a trained drafter at /tmp/smollm2-dflash, DRAFTER=1 serves it
    drafter=()
    if [ -n "${DRAFTER:-}" ]; then  # the `train` step's drafter on this warm machine, else the `drafter` step's parts
      [ -f /tmp/smollm2-dflash/model.safetensors ] ||
        { cat /tmp/drafter-parts/drafter.tar.part-* | tar -C /tmp -xf - ; } || { echo "no drafter" >&2; exit 2; }
      drafter=(--drafter /tmp/smollm2-dflash)
    fi
    timeout "${LIMIT:-560}" python3 tests/ddtree/serve_matrix.py --only "${ONLY:-full}" --model smollm2 --max-new 64 \
      --deadline "${DEADLINE:-470}" ${drafter[@]+"${drafter[@]}"} 2>&1 | tail -4
    jit_caches ;;
  incident)
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    # 8 of the 14 servers: with the 135M profile's baseline-relative T>0 check every gate samples each
    # prompt at 3 seeds per temperature (80 suite answers, not 32) and the baseline records them too;
    # 14 gates at once took 110 s with 32 (2026-12-01), so this set keeps the call under 600 s
    timeout 560 python3 tests/ddtree/incident.py --drafter /tmp/smollm2-dflash --deadline 540 \
      --only chain,patched-b16-k4,mutant-b16-k4,unpatched-b16-k4,unpatched-b7-k4,patched-b7-k4,patched-b15-k8,patched-b31-k4 \
      2>&1 | tail -4
    tar -C "$OUT" -czf "$OUT/gates.tgz" gates && rm -rf "$OUT/gates" "$OUT/logs" ;;
  sweep)
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    # the servers import the patched sglang + the plugin that the matrix step built in /tmp
    [ -d /tmp/ddtree-var/patched/sglang ] && [ -d /tmp/ddtree-plug ] || { echo "run the matrix step first" >&2; exit 2; }
    PYTHONPATH=/tmp/ddtree-var/patched:/tmp/ddtree-plug:$PYTHONPATH:$PWD/src:$PWD:$PWD/.carry/gate-py \
      timeout 560 python3 -m sglfleet.validation sweep --grid src/sglfleet/validation/grids/sglang-smollm2.yaml --out "$OUT/sweep" 2>&1 | tail -6
    tar -C "$OUT" -czf "$OUT/sweep.tgz" sweep && rm -rf "$OUT/sweep" ;;
  loadtest)
    # shellcheck disable=SC1091
    source tests/ddtree/device-env.sh
    [ -d /tmp/ddtree-var/patched/sglang ] && [ -d /tmp/ddtree-plug ] || { echo "run the matrix step first" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/locust .carry/locust-py/*.whl || exit 1
    PYTHONPATH=/tmp/ddtree-var/patched:/tmp/ddtree-plug:/tmp/locust:$PYTHONPATH:$PWD/src:$PWD:$PWD/.carry/gate-py \
      timeout 560 python3 tests/ddtree/loadtest_real.py --out "$OUT/loadtest" 2>&1 | tail -6
    tar -C "$OUT" -czf "$OUT/loadtest.tgz" loadtest && rm -rf "$OUT/loadtest" ;;
  proof-setup)
    W=/tmp/ddtree; mkdir -p $W/unpatched $W/patched $W/site
    python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site .carry/sglang/p1/whl/*.whl || exit 1
    tar -C $W/unpatched -xzf .carry/sglang/p1/sglang-slim.tgz && tar -C $W/patched -xzf .carry/sglang/p1/sglang-slim.tgz \
      && tar -C $W/patched -xzf .carry/proof/patched-files.tgz && rm -rf $W/mutant && cp -a $W/patched $W/mutant \
      && tar -C $W/mutant -xzf .carry/proof/mutant-files.tgz || exit 1
    grep -c "MUTANT seeds" $W/mutant/sglang/srt/layers/attention/triton_backend.py | sed 's/^/mutant markers: /' ;;
  proof-deps)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ddtree/site .carry/sglang/p2/whl/*.whl ;;
  proof)
    WORK=/tmp/ddtree PREPARED=1 JOBS="triton:patched triton:unpatched triton:mutant" TEST_TIMEOUT=170 BENCH=0 \
      timeout 230 bash tests/ddtree/gpu_proof.sh 2>&1 | tail -8 ;;
  proof-fi)
    tar -C /tmp/ddtree/site -xzf .carry/sglang/p3/fi-cutlass-inc.tgz
    WORK=/tmp/ddtree PREPARED=1 FLASHINFER_TGZ=.carry/sglang/p3/fislim.tgz JOBS="flashinfer:patched flashinfer:unpatched" \
      JIT_TIMEOUT=120 TEST_TIMEOUT=100 BENCH=0 timeout 260 bash tests/ddtree/gpu_proof.sh 2>&1 | tail -8 ;;
  *) echo "unknown step: $step" >&2; exit 2 ;;
esac
