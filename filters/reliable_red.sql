-- Red-band detections with a high real/bogus score.
diaSource.band IN ('i', 'z', 'y')
AND diaSource.reliability > 0.9
AND diaSource.snr > 10
