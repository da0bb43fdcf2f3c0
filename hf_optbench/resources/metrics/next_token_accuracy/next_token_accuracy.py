"""Next-token accuracy: the share of positions whose most likely next token is the true one.

An ``evaluate.Metric`` shipped inside hf_optbench so that ``evaluate.load(<this directory>)`` works offline (the
Hub's ``accuracy`` metric needs the network and scikit-learn). It computes what ``evaluate.load("accuracy")``
computes in transformers' ``examples/pytorch/language-modeling/run_clm.py``: the mean of ``predictions ==
references`` over the (already shifted and masked) token ids.
"""

import datasets
import evaluate
import numpy

_DESCRIPTION = "Next-token accuracy: mean of (predicted token id == reference token id)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted token ids (argmax of the logits at each position).
    references (list of int): the true next token ids, aligned with predictions.
Returns:
    accuracy (float or None): the share of equal ids in [0, 1]; None when there is no token.
"""
_CITATION = "transformers examples/pytorch/language-modeling/run_clm.py (compute_metrics, accuracy)"


class NextTokenAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        predictions = numpy.asarray(predictions)
        references = numpy.asarray(references)
        if references.size == 0:
            return {"accuracy": None}
        return {"accuracy": float((predictions == references).mean())}
