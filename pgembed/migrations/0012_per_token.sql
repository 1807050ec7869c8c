-- pgembed 0012: one more engine, onnx-int8-token (pgembed/encode/pertoken.py): int8 with each
-- token's activations quantized on their own, so a text's vector does not depend on the batch
-- it is encoded in. Like any precision, it is kept only if retrieval with its vectors agrees
-- with fp32's (precision.py).

ALTER TABLE pgembed.models
    DROP CONSTRAINT models_precision_check,
    ADD CONSTRAINT models_precision_check
        CHECK (precision IN
            ('fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8', 'onnx-int8-token')),
    DROP CONSTRAINT models_precision_requested_check,
    ADD CONSTRAINT models_precision_requested_check
        CHECK (precision_requested IN
            ('auto', 'fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8', 'onnx-int8-token'));
