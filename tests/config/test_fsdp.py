import json

from hf_lora_ds.config.fsdp import fsdp_settings, fsdp_version_2


def test_prefixes_dropped_from_a_dict_and_a_file(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_version": 1, "cpu_offload": True}))
    assert fsdp_settings(str(path)) == {"version": 1, "cpu_offload": True}
    assert fsdp_settings({"fsdp_version": 2}) == {"version": 2} and fsdp_settings(None) == {}
    assert not fsdp_version_2(str(path)) and fsdp_version_2({}) and fsdp_version_2({"version": "2"})
