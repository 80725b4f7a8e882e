"""Application side: record a turn, enqueue its calls, fan results in by call id.

from callgate.producer import Producer
producer = Producer.from_env()
turn = producer.submit(proposals, context)
fan_in = producer.collect(turn.turn_id, timeout=5)
"""

from callgate.producer.async_producer import AsyncProducer
from callgate.producer.producer import Collected, Producer

__all__ = ["AsyncProducer", "Collected", "Producer"]
