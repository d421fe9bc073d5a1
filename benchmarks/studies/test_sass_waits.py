"""benchmarks/studies/sass_waits.py decodes the scoreboards of SASS instructions (no GPU needed).

The sample is cuobjdump's output for four instructions of the CUDA kernel built for sm_90: the
int64 and int32 position loads, which set scoreboards 5 and 2, the int32 path's sign extension,
which waits on 2, and an add of position and offset, which waits on 5 and on the offset load's 3.
"""

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FUNCTION = "_ZN11rope_compat13rotary_kernelI13__nv_bfloat16fLi8ELi1EEEvNS_12RotaryParamsENS0_6LaunchE"
SAMPLE = f"""
\t\tFunction : {FUNCTION}
        /*0220*/               @P1 LDG.E.64 R6, desc[UR4][R2.64] ;                          /* 0x0000000402061981 */
                                                                                            /* 0x000362000c1e1b00 */
        /*0280*/              @!P1 LDG.E R6, desc[UR4][R4.64] ;                             /* 0x0000000404069981 */
                                                                                            /* 0x000ea4000c1e1900 */
        /*0290*/              @!P1 SHF.R.S32.HI R7, RZ, 0x1f, R6 ;                          /* 0x0000001fff079819 */
                                                                                            /* 0x004fd40000011406 */
        /*0350*/                   IADD3 R6, P0, R2, R6, RZ ;                               /* 0x0000000602067210 */
                                                                                            /* 0x028fca0007f1e0ff */
\t\tFunction : _ZN11rope_compat6otherEv
        /*0000*/                   EXIT ;                                                   /* 0x000000000000794d */
                                                                                            /* 0x000fea0003800000 */
"""


@pytest.fixture(scope="module")
def sass_waits():
    spec = importlib.util.spec_from_file_location("sass_waits", os.path.join(HERE, "sass_waits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scoreboards_decoded(sass_waits):
    got = [(addr, text.split()[1] if text.startswith("@") else text.split()[0], write, waits)
           for _, addr, text, write, waits in sass_waits.instructions(SAMPLE, "Li8ELi1E")]
    assert got == [
        ("0220", "LDG.E.64", 5, []),
        ("0280", "LDG.E", 2, []),
        ("0290", "SHF.R.S32.HI", -1, [2]),
        ("0350", "IADD3", -1, [3, 5]),
    ]


def test_only_matching_functions(sass_waits):
    assert [fn for fn, *_ in sass_waits.instructions(SAMPLE, "otherEv")] == ["_ZN11rope_compat6otherEv"]
    assert list(sass_waits.instructions(SAMPLE, "no_such_kernel")) == []
