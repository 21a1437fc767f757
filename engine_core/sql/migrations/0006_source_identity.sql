-- What a run's source data belongs to (for Pipedrive: the company), beside `source_account`, the
-- budget's key (host and token fingerprint). A worker whose source settings reach another company
-- claims nothing of the run; a rotated token of the same company keeps working. Null until known:
-- recorded at start when the source answers, else bound by the first worker that learns it.
ALTER TABLE migrations ADD COLUMN source_identity text;
