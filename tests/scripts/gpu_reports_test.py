#!/usr/bin/env python3
"""The GPU check's reports, held to hand-computed figures: scripts/gpu/bench_report.py and compare_losses.py."""
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


if __name__ == "__main__":
    unittest.main()
