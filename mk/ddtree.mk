# DDTree tree-verify patch: CPU layout test (CI) and the GPU proof (GPU host only).
.PHONY: ddtree-test gpu-test ddtree-bench

DDTREE_SGLANG_PATH ?=

ddtree-test: ## DDTree: CPU test of the patched tree-verify index math (applies the series)
	$(PY) -m pytest -q tests/ddtree/test_tree_verify_layout.py

gpu-test: ## DDTree: GPU proof (needs CUDA + DDTREE_SGLANG_PATH=<unpacked sglang 0.5.23, patched>)
	@test -n "$(DDTREE_SGLANG_PATH)" || { echo "set DDTREE_SGLANG_PATH=<dir containing sglang/>"; exit 2; }
	DDTREE_SGLANG_PATH=$(DDTREE_SGLANG_PATH) $(PY) -m pytest -q -m gpu tests/ddtree/test_tree_verify_gpu.py

ddtree-bench: ## DDTree: tree (budget 16, top-k 4) vs chain (block 8) verify attention cost on a GPU
	DDTREE_SGLANG_PATH=$(DDTREE_SGLANG_PATH) $(PY) bench/ddtree_verify_cost.py
