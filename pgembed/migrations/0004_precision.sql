-- pgembed 0004: the arithmetic precision each model encodes in, and why it was chosen.
-- `precision` is what every encoder of the model uses (sync workers and queries alike);
-- `precision_requested` is what the user asked for (auto, fp32, bf16, int8); a request whose
-- vectors disagree with fp32 ones falls back to fp32, with the measured cosine and a note.

ALTER TABLE pgembed.models
    ADD COLUMN precision text NOT NULL DEFAULT 'fp32'
        CHECK (precision IN ('fp32', 'bf16', 'fp16', 'int8')),
    ADD COLUMN precision_requested text NOT NULL DEFAULT 'fp32'
        CHECK (precision_requested IN ('auto', 'fp32', 'bf16', 'fp16', 'int8')),
    ADD COLUMN precision_cosine double precision,
    ADD COLUMN precision_note text NOT NULL DEFAULT '';
