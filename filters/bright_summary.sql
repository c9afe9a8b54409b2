-- Very high signal-to-noise detections, sent as a small record (a broker with format: lite).
-- The selected columns are the record's fields; the WHERE condition is the filter.
SELECT alert_id, diaSource.ra, diaSource.dec, diaSource.band,
       diaSource.psfFlux, diaSource.psfFluxErr, diaSource.snr
FROM alerts
WHERE diaSource.snr > 100
  AND NOT diaSource.isNegative
