"""Which CPUs keep llama.cpp's weights out of its AMX buffers (backends/llamacpp.cpu_has_amx); no llama.cpp needed."""

from draftverify.backends.llamacpp import cpu_has_amx

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n"


def test_amx_is_read_from_the_cpu_flags():
    assert cpu_has_amx(SAPPHIRE)
    assert not cpu_has_amx(EPYC)
    assert not cpu_has_amx("model name\t: amx_int8 in a name, not a flag\n")
    assert not cpu_has_amx("")


def test_the_running_machine_answers_without_error():
    assert cpu_has_amx() in (True, False)
