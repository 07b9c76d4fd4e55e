"""The local stack behind `kumiki up`: a broker, a Postgres and every service as processes on loopback.

Used by developers (`kumiki up`), by CI (to start Apache Kafka and the Debian Postgres) and by the tests
(to start the pip-installed development broker), so all three start infrastructure the same way.
"""
