"""The study monitor: what every attempt, host and queue of a study is doing now (`board`), the
alert rules with their per-study thresholds (`rules`, `settings`), the alerts they raise and clear
(`alerts`), and their delivery by e-mail and signed webhook (`delivery`)."""
