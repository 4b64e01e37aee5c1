//! `dp plan --device cuda` on a machine without a GPU: the budget is the GPU's, and the plan
//! says so, with the device's memory by role and what it turned on; `--largest` searches it.

mod common;

use common::{dp, failed, scratch, small_digits};

#[test]
fn dp_plan_under_cuda_prints_the_gpus_memory_and_finds_the_largest_model() {
    let dir = scratch("gpu-plan");
    small_digits(dir.path());
    let plan = |args: &[&str]| {
        let mut command = dp();
        command.args(["plan", "--device", "cuda", "--replicas", "1", "--data"]);
        command.arg(dir.path().join("train")).args(args).output().unwrap()
    };
    let largest = plan(&["--memory-budget", "64MiB", "--largest", "mlp"]);
    let stdout = String::from_utf8_lossy(&largest.stdout).into_owned();
    assert!(largest.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&largest.stderr));
    for line in ["memory plan    GPU memory", "of a 64.00 MiB budget", "on the GPU     parameters"]
    {
        assert!(stdout.contains(line), "{line}:\n{stdout}");
    }
    assert!(stdout.contains("largest        --model mlp:"), "{stdout}");
    // A budget below any plan of the model: the least GPU memory it takes, named.
    let error = failed(&plan(&["--memory-budget", "1MiB", "--model", "mlp:4096,2048"]));
    assert!(error.contains("of GPU memory") && error.contains("the least it can take"), "{error}");
}
