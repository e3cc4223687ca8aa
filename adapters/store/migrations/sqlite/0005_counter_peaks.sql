-- Each counter instance keeps the highest value it has held (its high-water mark), so
-- a budget tier reached within a period holds until the period ends even when a
-- released or settled-lower reservation lowers the counter.
ALTER TABLE counters ADD COLUMN peak INTEGER NOT NULL DEFAULT 0;
UPDATE counters SET peak = value;
