"""scripts/ holds what users run: every file there is a template or CI example that a test
exercises. The launchers themselves run in tests/test_cluster.py (mpirun, srun, sbatch);
here: the shell syntax of every template, and the GitHub Actions example as a workflow."""

import re
import subprocess

import pytest

from conftest import ROOT

SCRIPTS = ROOT / "scripts"
# every file under scripts/ -> where it runs for real (besides the syntax checks below)
EXERCISED = {
    "slurm/ncclbench.sbatch": "test_cluster.py::test_sbatch_script_runs_one_job, ::test_sbatch_templates_pass_test_only",
    "slurm/ncclbench-torchrun.sbatch": "test_cluster.py::test_sbatch_templates_pass_test_only",
    "slurm/ncclbench-fleet.sbatch": "test_cluster.py::test_sbatch_templates_pass_test_only",
    "mpirun-ncclbench.sh": "test_cluster.py::test_mpirun_wrapper_script_runs_two_ranks",
    "ci/install_cluster_tools.sh": ".ci/run",
    "ci/gpu-regression.yml": "test_github_workflow_example_is_a_valid_workflow",
    "heatmap_examples.py": "test_heatmap.py::test_the_example_script_draws_every_kind_small",
}
SHELL_FILES = sorted(p for p in SCRIPTS.rglob("*") if p.suffix in (".sh", ".sbatch")) + [
    ROOT / "benchmarks" / "gpu_validate.sh"]


def test_scripts_holds_only_exercised_user_files():
    found = sorted(str(p.relative_to(SCRIPTS)) for p in SCRIPTS.rglob("*") if p.is_file())
    assert found == sorted(EXERCISED), "a file in scripts/ without a test (or a listed one gone)"


def _bash_syntax_errors(path) -> str:
    """What `bash -n` says about the file ("" when it parses). Some errors, such as a broken
    [[ ]], are printed while bash -n still exits 0, so the text is what counts."""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    return proc.stderr.strip() or ("" if proc.returncode == 0 else f"bash -n exited {proc.returncode}")


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_template_syntax(path):
    assert _bash_syntax_errors(path) == ""
    assert path.read_text().startswith("#!"), "a template users run directly needs its interpreter line"


def _workflow():
    import yaml

    return yaml.safe_load((SCRIPTS / "ci" / "gpu-regression.yml").read_text())


def test_github_workflow_example_is_a_valid_workflow(tmp_path):
    """Parses as YAML with the keys GitHub requires; every `run:` step is valid bash once
    GitHub's ${{ }} expressions are filled in; the files it names exist in the repository."""
    flow = _workflow()
    assert flow["name"] and flow["jobs"]
    triggers = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert {"workflow_dispatch", "schedule", "push"} <= set(triggers)
    for job in flow["jobs"].values():
        assert job["runs-on"] and job["steps"]
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), step
            if "run" not in step:
                continue
            script = re.sub(r"\$\{\{.*?\}\}", "x", step["run"])
            path = tmp_path / "step.sh"
            path.write_text(script)
            assert _bash_syntax_errors(path) == "", step.get("name")
    named = set(re.findall(r"configs/[\w.-]+\.yaml", (SCRIPTS / "ci" / "gpu-regression.yml").read_text()))
    assert named and all((ROOT / n).exists() for n in named), named

