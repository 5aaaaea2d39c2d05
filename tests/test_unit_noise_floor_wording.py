"""The float32 noise floor's note where transformers' own float32 error is just under the tolerance: CodeShell's
3-layer tied checkpoint (transformers 9.32e-05 from float64, the port 1.66e-04, the port's function equal to the
remote code's to 2.6e-13 in float64) was told "the difference is the port's". The note gives the ratio and says that
rounding may explain a port within NOISE_FACTOR of it; a port well beyond it is still blamed."""

from __future__ import annotations

from scaffold.verify.parity import NOISE_FACTOR, NoiseFloor, ParityResult, PromptResult


def _result(delta: float) -> ParityResult:
    return ParityResult([PromptResult(37, delta / 2, delta, 16, 52, 52, 40)])


def test_a_port_within_the_factor_of_a_floor_just_under_the_tolerance_is_not_blamed():
    floor = NoiseFloor(_result(9.32e-05), _result(1.66e-04))
    detail = floor.detail()
    assert "1.8x transformers' own" in detail and "93% of the tolerance" in detail, detail
    assert "rounding may explain it" in detail and "so the difference is the port's" not in detail, detail
    assert not floor.within  # the verdict stays: parity failed, and the floor is under the tolerance


def test_a_port_beyond_the_factor_is_still_the_port_s():
    floor = NoiseFloor(_result(3.0e-05), _result(NOISE_FACTOR * 3.0e-05 * 1.5))
    assert "3x transformers' own" in floor.detail() and "so the difference is the port's" in floor.detail()
