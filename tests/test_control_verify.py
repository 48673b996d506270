"""The region-op verifiers of dialect/control.py name the op, the region and the types
when a region's arguments or the op's results do not match (rlx.if, rlx.while, rlx.scan)."""
from __future__ import annotations

import pytest
from xdsl.utils.exceptions import VerifyException

from rlxc.dialect import module as M

HEAD = ('builtin.module {\n  func.func @v(%p: tensor<i1>, %w: tensor<3xf32>, %x: tensor<4x3xf32>)'
        ' -> tensor<3xf32> {\n')
TAIL = '    func.return %w : tensor<3xf32>\n  }\n}\n'

IF_ARGS = '''    %0 = "rlx.if"(%p, %w) ({
    ^bb0(%1: tensor<2xf32>):
      rlx.yield %1 : tensor<2xf32>
    }, {
    ^bb0(%2: tensor<3xf32>):
      rlx.yield %2 : tensor<3xf32>
    }) : (tensor<i1>, tensor<3xf32>) -> tensor<3xf32>
'''
IF_RESULTS = '''    %0 = "rlx.if"(%p, %w) ({
    ^bb0(%1: tensor<3xf32>):
      rlx.yield %1 : tensor<3xf32>
    }, {
    ^bb0(%2: tensor<3xf32>):
      rlx.yield %2 : tensor<3xf32>
    }) : (tensor<i1>, tensor<3xf32>) -> tensor<4xf32>
'''
WHILE_ARGS = '''    %0 = "rlx.while"(%w) <{num_carry = 1 : i64}> ({
    ^bb0(%1: tensor<3xf32>):
      %3 = rlx.constant dense<false> : tensor<i1>
      rlx.yield %3 : tensor<i1>
    }, {
    ^bb0(%2: tensor<2xf32>):
      %4 = rlx.constant dense<1.000000e+00> : tensor<3xf32>
      rlx.yield %4 : tensor<3xf32>
    }) : (tensor<3xf32>) -> tensor<3xf32>
'''
SCAN_RESULTS = '''    %0, %1 = "rlx.scan"(%w, %x) <{length = 4 : i64, num_carry = 1 : i64, num_xs = 1 : i64}> ({
    ^bb0(%2: tensor<3xf32>, %3: tensor<3xf32>):
      rlx.yield %2, %3 : tensor<3xf32>, tensor<3xf32>
    }) : (tensor<3xf32>, tensor<4x3xf32>) -> (tensor<3xf32>, tensor<3x3xf32>)
'''


@pytest.mark.parametrize("body, msg", [
    (IF_ARGS, "rlx.if: then arguments (tensor<2xf32>) should be (tensor<3xf32>)"),
    (IF_RESULTS, "rlx.if: results (tensor<4xf32>) should be (tensor<3xf32>)"),
    (WHILE_ARGS, "rlx.while: body arguments (tensor<2xf32>) should be (tensor<3xf32>)"),
    (SCAN_RESULTS, "rlx.scan: results (tensor<3xf32>, tensor<3x3xf32>) should be "
                   "(tensor<3xf32>, tensor<4x3xf32>)"),
], ids=["if-args", "if-results", "while-args", "scan-results"])
def test_region_op_verifier_names_the_mismatch(body, msg):
    with pytest.raises(VerifyException) as e:
        M.parse(HEAD + body + TAIL).verify()
    assert msg in str(e.value)
