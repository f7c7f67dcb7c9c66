"""The cloud scheduler's queue of requests waiting for admission (FCFS, or by priority)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Iterator

from cloud_engine.request import Request


class WaitingQueue:
    """Requests waiting for admission: FCFS by arrival, or by (priority, arrival) under policy priority."""

    def __init__(self, policy: str):
        self.policy = policy
        self._fifo: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()  # ties after (priority, arrival): insertion order

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In admission order."""
        if self.policy == "fcfs":
            return iter(list(self._fifo))
        return iter([entry[-1] for entry in sorted(self._heap)])

    def __contains__(self, request: Request) -> bool:
        return any(r is request for r in self)

    def add(self, request: Request) -> None:
        if self.policy == "fcfs":
            self._fifo.append(request)
        else:
            heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._seq), request))

    def add_preempted(self, request: Request) -> None:
        """Requeue a preempted request ahead of every request of equal or lower importance."""
        if self.policy == "fcfs":
            self._fifo.appendleft(request)
        else:
            # Its (priority, arrival) key already puts it ahead of later arrivals of its priority.
            heapq.heappush(self._heap, (request.priority, request.arrival_time, -next(self._seq), request))

    def peek(self) -> Request:
        return self._fifo[0] if self.policy == "fcfs" else self._heap[0][-1]

    def pop(self) -> Request:
        return self._fifo.popleft() if self.policy == "fcfs" else heapq.heappop(self._heap)[-1]

    def remove(self, request: Request) -> None:
        if self.policy == "fcfs":
            self._fifo.remove(request)
        else:
            self._heap = [entry for entry in self._heap if entry[-1] is not request]
            heapq.heapify(self._heap)
