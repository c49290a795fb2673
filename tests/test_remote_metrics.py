"""Reading an inference server's own speculation counters from its Prometheus text (vLLM's names)."""
from decoding.remote.backends import SPECULATION_COUNTERS, parse_counters

VLLM_METRICS = """# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen"} 120.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="qwen"} 8.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen"} 77.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="0"} 40.0
vllm:num_requests_running{engine="0",model_name="qwen"} 0.0
"""


def test_counters_are_summed_over_labels_and_other_samples_ignored():
    assert parse_counters(VLLM_METRICS, SPECULATION_COUNTERS) == {"drafted": 128.0, "accepted": 77.0}


def test_a_server_without_the_counters_reports_none_of_them():
    assert parse_counters("# llama.cpp\nllamacpp:tokens_predicted_total 5\nbroken line\n", SPECULATION_COUNTERS) == {}
