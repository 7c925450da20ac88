# Load tests and capacity search (src/sglfleet/loadtests/). TARGET (the endpoint URL, as for validate) is required:
# there is no default target. HOST= as a URL still works here, with one warning line (HOST names inventory hosts).
#   make loadtest TARGET=http://127.0.0.1:30000 USERS=8 DURATION=60 [RATE=4 ARRIVAL=poisson] [STEPS=2:30,4:30]
#        [SLO_TTFT_MS=2000 SLO_ITL_MS=200 MAX_ERROR_RATE=0.01]   # SLOs are checked: a miss fails the target
#        (CHECK_SLO=0 only reports). `python -m sglfleet.loadtests run --check-slo` exits 1 on a miss, 2 on bad input
#        (an unreachable TARGET too); make keeps both (mk/exit-code.inc), as for capacity (1: no load met the SLOs).
#   make capacity TARGET=... [SLO_TTFT_MS=2000 SLO_ITL_MS=200 MAX_ERROR_RATE=0.01] [QUICK=1]
#   make loadtest-ui TARGET=...         # Locust web UI on :8089 with the same locustfile
#   [LOADTEST_CONFIG=f]                  # a YAML whose `loadtest:` section sets the defaults (was CONFIG=)
#   make bench-loadtest                  # harness ceiling vs sglang.bench_serving (see docs/loadtests.md)
.PHONY: loadtest capacity loadtest-ui bench-loadtest lt-need-host

ifneq ($(filter loadtest capacity loadtest-ui,$(MAKECMDGOALS)),)
ifeq ($(origin HOST),command line)
ifeq ($(TARGET),)
$(warning warning: HOST= for a load test is deprecated: use TARGET=$(HOST) (the endpoint, as for make validate))
endif
endif
endif
LT_TARGET = $(or $(TARGET),$(HOST))
LT_OUT_ARG = $(if $(OUT),--out $(OUT))
LT_COMMON = --host "$(LT_TARGET)" $(if $(LOADTEST_CONFIG),--config $(LOADTEST_CONFIG)) $(LT_OUT_ARG) \
  $(if $(PROCESSES),--processes $(PROCESSES)) $(if $(WORKLOAD),--workload $(WORKLOAD)) \
  $(if $(DATASET),--dataset $(DATASET)) $(if $(MAX_TOKENS),--max-tokens $(MAX_TOKENS)) \
  $(if $(INPUT_TOKENS),--input-tokens $(INPUT_TOKENS)) $(if $(OUTPUT_TOKENS),--output-tokens $(OUTPUT_TOKENS)) \
  $(if $(MAX_REQUESTS),--max-requests $(MAX_REQUESTS)) $(if $(SLO_TTFT_MS),--slo-ttft-ms $(SLO_TTFT_MS)) \
  $(if $(SLO_ITL_MS),--slo-itl-ms $(SLO_ITL_MS)) $(if $(MAX_ERROR_RATE),--max-error-rate $(MAX_ERROR_RATE))

lt-need-host:
	@if [ -z "$(LT_TARGET)" ]; then echo "error: TARGET is required, e.g. make $(MAKECMDGOALS) TARGET=http://127.0.0.1:30000" >&2; exit 2; fi

KEEP_RC_CMD_loadtest = $(PY) -m sglfleet.loadtests run $(LT_COMMON) $(if $(filter 0,$(CHECK_SLO)),,--check-slo) \
  $(if $(USERS),--users $(USERS)) $(if $(DURATION),--duration $(DURATION)) \
  $(if $(RATE),--rate $(RATE)) $(if $(ARRIVAL),--arrival $(ARRIVAL)) $(if $(STEPS),--steps $(STEPS)) \
  $(if $(WARMUP),--warmup $(WARMUP))
KEEP_RC_NEED_loadtest = $(LT_TARGET)
loadtest: $$(call KEEP_RC_PREREQ,loadtest,lt-need-host) ## [loadtests] headless Locust load test, fails on a missed SLO: TARGET=url USERS= DURATION= [SLO_TTFT_MS= RATE= STEPS=]
	$(KEEP_RC_RUN)

KEEP_RC_CMD_capacity = $(PY) -m sglfleet.loadtests capacity $(LT_COMMON) $(if $(QUICK),--quick) $(if $(MODE),--mode $(MODE)) \
  $(if $(MAX_LOAD),--max-load $(MAX_LOAD))
KEEP_RC_NEED_capacity = $(LT_TARGET)
capacity: $$(call KEEP_RC_PREREQ,capacity,lt-need-host) ## [loadtests] capacity search under SLOs: TARGET=url [SLO_TTFT_MS= SLO_ITL_MS= MAX_ERROR_RATE= QUICK=1 MODE=rate]
	$(KEEP_RC_RUN)

loadtest-ui: lt-need-host ## [loadtests] Locust web UI (same locustfile): TARGET=url [WEB_PORT=8089]
	$(PY) -m sglfleet.loadtests ui $(LT_COMMON) $(if $(USERS),--users $(USERS)) $(if $(DURATION),--duration $(DURATION)) \
	  $(if $(WEB_PORT),--web-port $(WEB_PORT))

bench-loadtest: ## [lab] harness ceiling: tokens/s + req/s per client core vs sglang.bench_serving
	$(PY) bench/loadtest_ceiling.py $(if $(OUT),--out $(OUT))
