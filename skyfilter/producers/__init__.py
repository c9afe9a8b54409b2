"""Alert simulation and replay into Kafka (``skyfilter produce``): simulated Rubin alerts with FITS
cutouts, files of real alerts, the visit cadence and parallel producer processes.  Built on the schemas,
Kafka and registry rooms, without Spark."""
