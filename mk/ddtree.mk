# DDTree tree-verify patch: CPU layout test (CI) and the GPU proof (GPU host only).
.PHONY: ddtree-serve-carry ddtree-test gpu-test gpu-test-flashinfer ddtree-flashinfer-carry ddtree-bench

DDTREE_SGLANG_PATH ?=

ddtree-test: ## [patches] DDTree: CPU tests (index math, tree, walk, exactness, sglang's parser on rendered commands)
	$(PY) -m pytest -q tests/ddtree/test_tree_verify_layout.py tests/ddtree/test_ddtree_tree.py \
	  tests/ddtree/test_ddtree_args.py tests/ddtree/test_serve_matrix_cpu.py

gpu-test: ## [lab] DDTree: GPU proof (needs CUDA + DDTREE_SGLANG_PATH=<unpacked sglang 0.5.23, patched>)
	@test -n "$(DDTREE_SGLANG_PATH)" || { echo "set DDTREE_SGLANG_PATH=<dir containing sglang/>"; exit 2; }
	DDTREE_SGLANG_PATH=$(DDTREE_SGLANG_PATH) $(PY) -m pytest -q -m gpu tests/ddtree/test_tree_verify_gpu.py

gpu-test-flashinfer: ## [lab] DDTree: GPU proof of the FlashInfer backend (needs CUDA, nvcc, flashinfer-python 0.7.2 importable)
	@test -n "$(DDTREE_SGLANG_PATH)" || { echo "set DDTREE_SGLANG_PATH=<dir containing sglang/>"; exit 2; }
	$(PY) tests/ddtree/flashinfer_jit_warmup.py
	DDTREE_SGLANG_PATH=$(DDTREE_SGLANG_PATH) $(PY) -m pytest -q -m gpu -k flashinfer tests/ddtree/test_tree_verify_gpu.py

ddtree-flashinfer-carry: ## [lab] DDTree: build .carry-fi/ (slim flashinfer + sglang + patched files) for the lent H200
	PY=$(PY) bash tests/ddtree/make_flashinfer_carry.sh

ddtree-bench: ## [lab] DDTree: tree (budget 16, top-k 4) vs chain (block 8) verify attention cost on a GPU
	DDTREE_SGLANG_PATH=$(DDTREE_SGLANG_PATH) $(PY) bench/ddtree_verify_cost.py

ddtree-serve-carry: ## [lab] DDTree: wheels of the plugin + the test-only oracle for tests/ddtree/serve_matrix.py on the H200
	bash tests/ddtree/make_server_carry.sh
