"""Where the learner computes (--device): the best that works, or a clear refusal."""

import pytest
import torch

from echo_learner.training.device import DeviceUnavailable, choose


def test_auto_takes_a_cuda_gpu_when_there_is_one_else_the_cpu():
    device, why = choose("auto")
    assert device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert why.startswith("auto:")
    assert choose("cpu")[0].type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_asking_for_a_missing_gpu_says_what_it_needs():
    with pytest.raises(DeviceUnavailable, match="needs a CUDA build of torch"):
        choose("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(DeviceUnavailable, match="Apple silicon"):
            choose("mps")
