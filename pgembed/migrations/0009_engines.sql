-- pgembed 0009: a model's precision may name an engine (pgembed/encode/engines.py): its
-- transformer exported to ONNX and run by onnxruntime, in fp32 (fused) or int8. Like any
-- precision, one is kept only if retrieval with its vectors agrees with fp32's (precision.py).

ALTER TABLE pgembed.models
    DROP CONSTRAINT models_precision_check,
    ADD CONSTRAINT models_precision_check
        CHECK (precision IN ('fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8')),
    DROP CONSTRAINT models_precision_requested_check,
    ADD CONSTRAINT models_precision_requested_check
        CHECK (precision_requested IN
            ('auto', 'fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8'));
