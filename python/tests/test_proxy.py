"""``veil proxy`` driven by the ``openai`` package, as tools that speak the OpenAI API drive it: on
a tiny random Llama in the fixed-point simulator, a whole and a streamed completion equal
``veil generate``'s text for the same seed, and a bad request raises the API's own error class
with the proxy's error object while the proxy keeps answering.
The ``veil`` command is ``veil_cli.veil_binary()``'s."""

import json
import os
import subprocess
import threading

import pytest

from veil_cli import veil_binary

try:
    import openai
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("the openai package is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def proxy(decoder):
    p = subprocess.Popen(
        [veil_binary(), "proxy", "--model", str(decoder), "--simulate",
         "--listen", "127.0.0.1:0", "--served-name", "tiny"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        for line in p.stderr:
            if "at http://" in line:
                base = line.split("at ", 1)[1].strip()
                break
        else:
            pytest.fail(f"veil proxy exited with {p.wait()} before listening")
        # Drain its stderr so that it never blocks on a full pipe.
        threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
        yield openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    finally:
        p.kill()
        p.wait()


def generated(decoder, prompt, **flags):
    args = [veil_binary(), "generate", "--model", str(decoder), "--simulate", "--chat", "--json"]
    for k, v in flags.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(args + [prompt], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_whole_and_streamed_completions_equal_veil_generate(decoder, proxy):
    want = generated(decoder, "good film", max_new_tokens=8, temperature=0.8, seed=21)
    ask = dict(model="tiny", messages=[{"role": "user", "content": "good film"}],
               max_tokens=8, temperature=0.8, seed=21)

    whole = proxy.chat.completions.create(**ask)
    assert whole.choices[0].message.content == want["text"]
    assert whole.usage.prompt_tokens == want["prompt_tokens"]
    assert whole.usage.completion_tokens == len(want["token_ids"])
    assert whole.choices[0].finish_reason == ("stop" if want["stopped"] else "length")

    pieces = [c.choices[0].delta.content or ""
              for c in proxy.chat.completions.create(stream=True, **ask) if c.choices]
    assert "".join(pieces) == want["text"]

    assert [m.id for m in proxy.models.list().data] == ["tiny"]


def test_bad_requests_raise_the_apis_errors_and_the_proxy_survives(proxy):
    msg = [{"role": "user", "content": "good"}]
    with pytest.raises(openai.NotFoundError) as e:
        proxy.chat.completions.create(model="gpt-4o", messages=msg)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        proxy.chat.completions.create(model="tiny", messages=msg, max_tokens=100_000)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        proxy.chat.completions.create(model="tiny", messages=msg, n=3)
    assert e.value.body["param"] == "n"
    ok = proxy.chat.completions.create(model="tiny", messages=msg, max_tokens=2, temperature=0)
    assert ok.choices[0].message.role == "assistant"
