"""``tests/bench_round.py --gpu``, the one command that measures the five scripts on a GPU: it
refuses a machine without CUDA in one line, and its flow (run each script, read metrics.csv and
summary.json, sample the GPU) runs on the CPU with tiny sizes, printing n/a where a GPU is needed;
its nvidia-smi sampling is checked with a stand-in. And tests/bench_vmap.py's prototype of
training clients together: vmap'd SGD equals the loop."""
import os
import re
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import run_script

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_round  # noqa: E402

SCRIPTS = ["fedavg", "fedala", "pfedla", "fedpake", "fedacd"]
ROWS = SCRIPTS + ["fedavg-p1"]  # the last: FedAvg with --parallel-clients 1


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")


@NO_GPU
@pytest.mark.slow  # end to end, several seconds: runs in CI with the full suite
def test_cuda_without_a_gpu_is_refused_in_one_line():
    r = run_script("tests/bench_round.py", "--device", "cuda", timeout=120)
    assert r.returncode == 2
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()  # no traceback
    assert line.startswith("error: ") and "no CUDA GPU" in line, line


@NO_GPU
@pytest.mark.parametrize("flags", [["--gpu"], ["--gpu", "--device", "cuda:0"], ["--scale", "--device", "cuda"]])
def test_every_mode_refuses_cuda_without_a_gpu(flags, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_round.py", *flags])
    with pytest.raises(SystemExit) as exit_:
        bench_round.main()
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "no CUDA GPU" in err


def test_utilisation_sampler_reads_nvidia_smi_lines_in_a_window():
    fake = ("import time\nprint('[N/A], [N/A]', flush=True)\n"
            "for i in range(40):\n    print(f'{10 * (i % 2)}, {1000 + i}', flush=True); time.sleep(0.01)")
    with bench_round.UtilisationSampler(torch.device("cpu"), command=[sys.executable, "-c", fake]) as sampler:
        deadline = time.perf_counter() + 30
        while len(sampler.samples) < 40 and time.perf_counter() < deadline:
            time.sleep(0.02)
    assert len(sampler.samples) == 40  # the [N/A] line is skipped
    times = [t for t, _, _ in sampler.samples]
    util, mb = sampler.between(times[0], times[-1] + 1)
    assert util == 5.0 and mb == 1039.0
    assert sampler.between(times[-1] + 1, times[-1] + 2) == (None, None)
    assert sampler.baseline_mb() == 1000.0
    with bench_round.UtilisationSampler(torch.device("cpu")) as none:  # a CPU: nothing sampled
        pass
    assert none.source is None and none.between(0, float("inf")) == (None, None)


def test_the_models_the_table_names_are_the_scripts_auto_models():
    assert [bench_round.model_name("auto", s) for s in SCRIPTS] == ["cnn", "cnn", "pfedlacnn", "resnet18", "simplecnn"]
    assert bench_round.model_name("lenet", "pfedla") == "lenet"


@pytest.mark.slow  # six script runs end to end (30-40 s on 2 cores; start-up is most of it)
def test_gpu_mode_runs_on_the_cpu_and_prints_a_row_per_script():
    r = run_script("tests/bench_round.py", "--gpu", "--device", "cpu", "--samples", "300", "--rounds", "2",
                   "--num-clients", "2", "--model", "mlp", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("device: CPU")
    header = next(i for i, l in enumerate(lines) if l.startswith("script "))
    assert lines[header].split()[:6] == ["script", "model", "clients", "SGD", "steps", "s/round"]
    rows = [l.split() for l in lines[header + 1:header + 1 + len(ROWS)]]
    assert [row[0] for row in rows] == ROWS
    for row in rows:
        name, model, clients, steps, sec, ms_step, util, smi, peak = row
        assert model == "mlp" and int(clients) >= 1 and float(steps) > 0
        assert float(sec) > 0 and float(ms_step) > 0
        assert (util, smi, peak) == ("n/a", "n/a", "n/a")  # no GPU: nothing to sample, no device peak
    assert re.search(r"s/round: median of round 2 \(metrics.csv", r.stdout)


def test_clients_together_with_vmap_equal_the_loop():
    """tests/bench_vmap.py's prototype on 3 clients of different sizes (partial last batches, clients
    that finish early): the vmap'd steps give the loop's result, to float64 rounding in float64."""
    import bench_vmap
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = bench_vmap.run(clients=3, steps=3, ragged=True, repeats=1, quiet=True)
    finally:
        torch.set_num_threads(threads)
    assert r["float64"] < 1e-12, r
    assert r["float32"] < 1e-4 and r["change"] > 1e-4, r  # float32: rounding (and a flipped max-pool at most)


def test_the_sampler_names_the_gpu_to_nvidia_smi_by_uuid(tmp_path, monkeypatch):
    """On a GPU machine: the sampler asks nvidia-smi for the GPU that CUDA calls cuda:0 by its UUID
    (falling back to the index), and reads its looping output. Here with a stand-in nvidia-smi."""
    bare = "6c5b2b0e-1234-5678-9abc-def012345678"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!{sys.executable}\n"
                    "import sys, time\n"
                    "args = sys.argv[1:]\n"
                    f"if args[0] != '--id=GPU-{bare}': sys.exit(6)\n"
                    "if '--query-gpu=name' in args: print('NVIDIA H100'); sys.exit(0)\n"
                    "for i in range(1000): print(f'{i % 100}, {500 + i}', flush=True); time.sleep(0.01)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=bare))
    with bench_round.UtilisationSampler(torch.device("cuda")) as sampler:
        deadline = time.perf_counter() + 30
        while len(sampler.samples) < 5 and time.perf_counter() < deadline:
            time.sleep(0.02)
    assert sampler.source == "nvidia-smi" and f"--id=GPU-{bare}" in sampler.cmd
    assert len(sampler.samples) >= 5 and sampler.baseline_mb() == 500.0
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid="not-a-uuid"))
    assert bench_round.UtilisationSampler._nvidia_smi_id(torch.device("cuda", 0)) is None  # "0" is refused too
