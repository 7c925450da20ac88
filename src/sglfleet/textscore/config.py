"""The limits of the baseline-free text detectors (textscore/detectors.py): the gate config's `thresholds`
section (validation/config.py GateConfig.thresholds)."""

from __future__ import annotations

from pydantic import Field, field_validator

from sglfleet.pipeline.config import StrictModel


class DetectorThresholds(StrictModel):
    """Limits of the garbage detectors (see textscore/detectors.py)."""

    disabled: list[str] = Field(default_factory=list, description="detector names to skip")
    min_chars: int = Field(default=1, ge=1)
    # char_run: longest allowed run of one character, by class
    max_letter_run: int = Field(default=8, ge=2)
    max_digit_run: int = Field(default=24, ge=2)
    max_symbol_run: int = Field(default=5, ge=2)
    max_bracket_run: int = Field(default=6, ge=2)
    max_rule_run: int = Field(default=80, ge=2)
    max_zero_run: int = Field(default=120, ge=2)
    max_space_run: int = Field(default=200, ge=2)
    max_newline_run: int = Field(default=8, ge=2)
    skip_code_for_runs: bool = True
    # ngram_loop: a block of <= loop_max_period tokens repeated >= loop_min_repeats times in a row,
    # covering >= loop_min_tokens tokens
    loop_max_period: int = Field(default=40, ge=1)
    loop_min_repeats: int = Field(default=4, ge=2)
    loop_min_tokens: int = Field(default=24, ge=2)
    loop_min_share: float = Field(default=0.6, gt=0, le=1, description="or: the loop is most of a short answer")
    loop_short_max_period: int = Field(default=3, ge=1, description="or: a block this short ...")
    loop_short_min_repeats: int = Field(default=6, ge=2, description="... repeated this often")
    # token_soup
    lexicon_size: int = Field(default=200_000, ge=1000)
    soup_min_words: int = Field(default=8, ge=1)
    max_unknown_word_rate: float = Field(default=0.2, gt=0, le=1)
    max_glued_words: int = Field(default=1, ge=0)
    max_glued_rate: float = Field(default=0.1, ge=0, le=1)
    function_free_run_words: int = Field(default=10, ge=4)
    # bad_chars / script_salad
    max_bad_chars: int = Field(default=0, ge=0)
    max_mixed_script_words: int = Field(default=1, ge=0)
    max_scripts: int = Field(default=4, ge=1)
    script_min_share: float = Field(default=0.05, gt=0, le=1)
    # collapse
    collapse_min_words: int = Field(default=30, ge=4)
    collapse_tail_fraction: float = Field(default=0.35, gt=0, lt=1)
    collapse_max_symbol_share: float = Field(default=0.35, gt=0, le=1)
    collapse_last_words: int = Field(default=12, ge=4)
    collapse_last_unknown_rate: float = Field(default=0.25, gt=0, le=1)
    # subword_repeat: a unit of 2-8 letters repeated without spaces
    subword_min_repeats: int = Field(default=4, ge=2)
    subword_min_chars: int = Field(default=12, ge=4)
    subword_min_chars_code: int = Field(default=24, ge=4, description="inside fenced / inline code")
    # mojibake: stray symbols in one token, or within a window of 24 characters
    mojibake_token_odd: int = Field(default=2, ge=1)
    mojibake_window_odd: int = Field(default=4, ge=2)
    # word_order: determiner-before-function-word pairs and glued words
    word_order_min_events: int = Field(default=2, ge=1)
    word_order_short_words: int = Field(default=12, ge=0, description="up to this many words one anomaly fails")
    word_order_min_rate: float = Field(default=0.02, ge=0, le=1)
    stray_emphasis_min: int = Field(default=3, ge=1, description="markdown stars out of order (closing with no "
                                    "opening, glued between words) that make a word_order finding")
    # near_repeat: one stem dominating a window; sentences that are near-copies of each other
    stutter_window: int = Field(default=16, ge=4)
    stutter_min_share: float = Field(default=0.4, gt=0, le=1)
    near_repeat_min_words: int = Field(default=6, ge=2)
    near_repeat_similarity: float = Field(default=0.7, gt=0, le=1)
    near_repeat_min_copies: int = Field(default=3, ge=2)
    near_repeat_min_share: float = Field(default=0.5, gt=0, le=1)
    # a refrain (one line template, 1-2 slots with new words, whole lines, part of the answer) is not a
    # near-copy: the SmolLM2 gate of 2026-12-01 (docs/results/incident-gate-base-2026-12-01.json.gz) failed two
    # such T=0.8 poems at 61 % / 65 % of their words; every generated near-copy corruption covers 100 %
    refrain_max_share: float = Field(default=0.8, gt=0, le=1)
    refrain_max_slots: int = Field(default=2, ge=1)
    exact_repeat_min_copies: int = Field(default=3, ge=2)
    exact_repeat_min_share: float = Field(default=0.6, gt=0, le=1)
    near_repeat_max_sentences: int = Field(default=400, ge=10, description="cost bound (pairwise comparison)")
    # a long answer that is mostly copies of one long passage (code and broken fences included): runs of
    # passage_run_words words seen 3+ times cover passage_min_share of its words, the copies (median)
    # passage_min_period words apart or more; answers under passage_min_words words are not judged so
    passage_run_words: int = Field(default=8, ge=3)
    passage_min_words: int = Field(default=120, ge=20)
    passage_min_share: float = Field(default=0.7, gt=0, le=1)
    passage_min_period: int = Field(default=40, ge=2)

    @field_validator("disabled")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        known = {"empty", "char_run", "ngram_loop", "token_soup", "bad_chars", "script_salad", "collapse",
                 "subword_repeat", "mojibake", "word_order", "near_repeat"}
        unknown = sorted(set(v) - known)
        if unknown:
            raise ValueError(f"unknown detector(s) {unknown}; known: {sorted(known)}")
        return v
