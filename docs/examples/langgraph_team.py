"""Two LangGraph processes share memory through a MEMP broker.

Run one process per agent, each naming itself and the other (docs/langgraph.md):

    MEMP_BASE_URL=http://127.0.0.1:8080 MEMP_API_KEY=... MEMP_NAMESPACE=my-app \\
        python docs/examples/langgraph_team.py alice bob &
    MEMP_BASE_URL=http://127.0.0.1:8080 MEMP_API_KEY=... MEMP_NAMESPACE=my-app \\
        python docs/examples/langgraph_team.py bob alice

Each graph writes what its agent knows to the store, then waits until the other process's
graph has written its own, and prints it."""

from __future__ import annotations

import sys
import time
from typing import TypedDict

from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph

from memp.langgraph import MempStore


class State(TypedDict):
    me: str
    other: str
    heard: str


def remember(state: State) -> dict[str, str]:
    """Write what this agent knows, under ("team", <agent>)."""
    get_store().put(("team", state["me"]), "status",
                    {"text": f"{state['me']} is working on the report", "at": time.time()})
    return {}


def recall(state: State) -> dict[str, str]:
    """Wait (up to 20 s) for the other agent's status, written by the other process."""
    store = get_store()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        item = store.get(("team", state["other"]), "status")
        if item is not None:
            return {"heard": item.value["text"]}
        time.sleep(0.1)
    raise TimeoutError(f"{state['other']} said nothing")


def build(store: MempStore):  # type: ignore[no-untyped-def]
    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("recall", recall)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "recall")
    graph.add_edge("recall", END)
    return graph.compile(store=store)


def main(me: str, other: str) -> None:
    with MempStore(prefix="langgraph-demo") as store:  # MEMP_* from the environment
        result = build(store).invoke({"me": me, "other": other, "heard": ""})
        print(f"{me} heard: {result['heard']}")
        teammates = store.list_namespaces(prefix=("team",))
        print(f"{me} sees: {', '.join(ns[1] for ns in teammates)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
