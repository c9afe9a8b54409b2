-- Bright, reliable, positive difference-image detections: likely real transients.
diaSource.snr > 50
AND diaSource.reliability > 0.8
AND NOT diaSource.isNegative
