from autotune.model.occupancy import ctas_per_sm, limits_for


def test_h200_figures_match_the_occupancy_calculator() -> None:
    # 128 threads at 255 registers: 4 warps * 8192 registers = 32768 -> 2 CTAs by registers.
    r = ctas_per_sm(90, 255, 128, 96 * 1024)
    assert (r["by_registers"], r["by_smem"], r["ctas"]) == (2, 2, 2)
    # 256 threads at 232 registers (rounded to 7424 per warp): 65536 // 59392 = 1.
    assert ctas_per_sm(90, 232, 256, 160 * 1024)["ctas"] == 1
    # 48 KB CTAs: shared memory allows 4 (233472 // 50176), registers 217 -> 56 * 32 = 7168
    # per warp, 28672 per CTA -> 2.
    r = ctas_per_sm(90, 217, 128, 48 * 1024)
    assert (r["by_smem"], r["by_registers"], r["ctas"]) == (4, 2, 2)


def test_newer_architectures_use_the_nearest_known_limits() -> None:
    assert limits_for(100) == limits_for(90)
    assert limits_for(86).smem_bytes < limits_for(80).smem_bytes
