#!/usr/bin/env python3
"""The GPU check's reports, held to hand-computed figures: scripts/gpu/bench_report.py, compare_losses.py and
kernel_times.py."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu")


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), *args], capture_output=True, text=True)


class BenchReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.zero = ["--zero=bf16=" + self.write("zero.csv", "stage,step_ms,tokens/s\n0,81.92,100000\n"),
                     "--zero=bf16 + TF32 GEMMs=" + self.write("tf32.csv", "stage,step_ms,tokens/s\n0,27.31,300000\n")]
        header = "mode,torch,batch,seq,layers,channels,params,step_ms,tokens/s\n"
        self.torch = [self.write("eager.csv", header + "eager,2.11.0,8,1024,12,768,124475904,40.96,200000\n"),
                      self.write("compile.csv", header + "compile,2.11.0,8,1024,12,768,124475904,20.48,400000\n")]

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_mfu_counts_weights_and_causal_attention_over_the_dense_peak_and_each_run_against_the_fastest_torch(self):
        r = run("bench_report.py", "--gpu=NVIDIA H100 80GB HBM3", *self.zero, *self.torch)
        self.assertEqual(r.returncode, 0, r.stderr)
        # 6·124475904 + 6·12·768·1024 = 803478528 FLOP per token; at 1e5 tokens/s, 80.35 TFLOP/s of 989.4. The last
        # column divides by torch compile's 4e5 tokens/s.
        self.assertIn("0.803 GFLOP per token", r.stdout)
        self.assertRegex(r.stdout, r"zero bf16 +100000\.0 +80\.35 +8\.1% +0\.250")
        self.assertRegex(r.stdout, r"zero bf16 \+ TF32 GEMMs +300000\.0 +241\.04 +24\.4% +0\.750")
        self.assertRegex(r.stdout, r"torch eager \(2\.11\.0\) +200000\.0 +160\.70 +16\.2% +0\.500")
        self.assertRegex(r.stdout, r"torch compile \(2\.11\.0\) +400000\.0 +321\.39 +32\.5% +1\.000")

    def test_the_pcie_h100_has_its_own_peak_and_an_unknown_gpu_gets_no_mfu(self):
        pcie = run("bench_report.py", "--gpu=NVIDIA H100 PCIe", *self.zero, *self.torch)
        self.assertIn("dense bf16 peak 756.0 TFLOP/s", pcie.stdout)
        other = run("bench_report.py", "--gpu=Some GPU", *self.zero, *self.torch)
        self.assertIn("unknown (no MFU)", other.stdout)
        self.assertRegex(other.stdout, r"zero bf16 +100000\.0 +80\.35 +- +0\.250")

    def test_a_label_may_hold_an_equals_sign_and_one_without_a_label_is_refused(self):
        path = self.zero[0].split("=", 2)[2]
        r = run("bench_report.py", "--gpu=Some GPU", "--zero=B=8=" + path, *self.torch)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"zero B=8 +100000\.0")
        refused = run("bench_report.py", "--gpu=Some GPU", "--zero=" + path, *self.torch)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("expected LABEL=CSV", refused.stderr)


class CompareLossesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def metrics(self, name, first_loss, val_loss):
        path = os.path.join(self.dir.name, name)
        records = [{"event": "train", "step": 1, "loss": first_loss}, {"event": "train", "step": 2, "loss": 2.0},
                   {"event": "eval", "step": 2, "val_loss": val_loss}, {"event": "summary"}]
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        return path

    def test_runs_within_the_tolerances_pass(self):
        ref = self.metrics("cpu.jsonl", 2.5, 1.0)
        close = self.metrics("gpu.jsonl", 2.5 * (1 + 5e-6), 1.0 * (1 + 0.01))
        self.assertEqual(run("compare_losses.py", ref, close).returncode, 0)

    def test_a_first_step_beyond_summation_order_fails(self):
        ref = self.metrics("cpu.jsonl", 2.5, 1.0)
        off = self.metrics("gpu.jsonl", 2.5 * (1 + 2e-5), 1.0)
        r = run("compare_losses.py", ref, off)
        self.assertEqual(r.returncode, 1)
        self.assertIn("beyond tolerance", r.stdout)

    def test_a_final_validation_loss_off_by_more_than_two_percent_fails(self):
        ref = self.metrics("cpu.jsonl", 2.5, 1.0)
        self.assertEqual(run("compare_losses.py", ref, self.metrics("gpu.jsonl", 2.5, 1.03)).returncode, 1)


class KernelTimesTest(unittest.TestCase):
    # ncu's CSV after the profiled program's own output: one kernel launched with two grids, another twice.
    NCU = (
        "==PROF== Connected to process 1\n"
        "# zero-bench stages: GPT-2\n"
        '"Process ID","Process Name","Host Name","Kernel Name","Block Size","Grid Size","Device","CC",'
        '"Invocations","Section Name","Metric Name","Metric Unit","Minimum","Maximum","Average"\n'
        '"1","zero-bench","h","void kernels::<unnamed>::sums_kernel<kernels::Term>(int, float *)","(32, 8, 1)",'
        '"(24, 1, 1)","0","9.0","3","Command line profiler metrics","gpu__time_duration.sum","ns","1","1",'
        '"1,000.00"\n'
        '"1","zero-bench","h","void kernels::<unnamed>::sums_kernel<kernels::Term>(int, float *)","(32, 8, 1)",'
        '"(96, 1, 1)","0","9.0","1","Command line profiler metrics","gpu__time_duration.sum","ns","1","1",'
        '"3,000.00"\n'
        '"1","zero-bench","h","kernels::<unnamed>::attention_forward_kernel(float *)","(256, 1, 1)",'
        '"(64, 1, 1)","0","9.0","2","Command line profiler metrics","gpu__time_duration.sum","ns","1","1",'
        '"9,000.00"\n'
    )

    def test_kernels_are_summed_over_grids_and_ranked_by_total_time(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ncu.csv")
            with open(path, "w") as f:
                f.write(self.NCU)
            r = run("kernel_times.py", path)
            one = run("kernel_times.py", "--top=1", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        # attention 2 x 9 us = 18 us of 24; the sums 3 x 1 + 1 x 3 = 6 us over 4 calls.
        self.assertIn("0.02 ms in 6 kernel calls", r.stdout)
        lines = r.stdout.splitlines()
        self.assertRegex(lines[2], r"0\.02 +75\.0% +2 +9\.0  kernels::attention_forward_kernel$")
        self.assertRegex(lines[3], r"0\.01 +25\.0% +4 +1\.5  kernels::sums_kernel<kernels::Term>$")
        self.assertRegex(one.stdout.splitlines()[-1], r"0\.01 +25\.0% +4 +1 others$")

    def test_a_base_run_is_set_beside_each_kernel_and_the_kernels_gone_since_are_listed(self):
        # Before: the sums 3 x 1 us, attention 2 x 19 us and a bias kernel 5 us (46 us); now the file above (24 us).
        base = self.NCU.replace('"(96, 1, 1)","0","9.0","1"', '"(96, 1, 1)","0","9.0","0"').replace(
            '"9,000.00"', '"19,000.00"') + (
            '"1","zero-bench","h","void kernels::bias_kernel(float *)","(256, 1, 1)","(8, 1, 1)","0","9.0","1",'
            '"Command line profiler metrics","gpu__time_duration.sum","ns","1","1","5,000.00"\n')
        with tempfile.TemporaryDirectory() as d:
            now_path, base_path = os.path.join(d, "now.csv"), os.path.join(d, "base.csv")
            with open(now_path, "w") as f:
                f.write(self.NCU)
            with open(base_path, "w") as f:
                f.write(base)
            r = run("kernel_times.py", "--top=1", "--base", base_path, now_path)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "0.02 ms in 6 kernel calls, 0.05 ms before (-0.02 ms)")
        self.assertRegex(lines[2], r"^ +0\.02 +0\.04 +-0\.02  kernels::attention_forward_kernel$")
        self.assertRegex(lines[3], r"^ +0\.00 +0\.01 +-0\.01  kernels::bias_kernel  \(gone\)$")
        self.assertRegex(lines[4], r"^ +0\.01 +0\.00 +\+0\.00  1 others$")

    def test_input_without_a_summary_fails_saying_so(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
            f.write("==PROF== no kernels were profiled\n")
            f.flush()
            r = run("kernel_times.py", f.name)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no ncu per-kernel summary", r.stderr)


if __name__ == "__main__":
    unittest.main()
