"""Human approval of destructive tool calls.

The policy names tools whose calls a person must approve (gateway/policy/approvals.py).
When the engine answers a request with a call of one of them, the gateway holds it: the
agent gets an assistant message saying the action awaits approval (its id also in
`X-Gateway-Approval-Pending`) and no tool call. A key with the `approver` role decides it
(`POST /v1/approvals/{id}`, gateway/api/approvals.py). On the conversation's next request
the gateway answers from the approval without the engine: the held call, as the engine
made it, once approved; that a reviewer denied it; or that it still waits. Every step is
on the request's trace and in the tenant's audit log.

    records.py          an approval: the held call, its decision, its outcome
    store.py            approvals in Redis (write-once decision and outcome)
    audit.py            the audit stream, the `gateway.audit` log, the metric
    decisions.py        read, list, decide (the API's side)
    gate.py             the request path's side: guard, hold, resume
    messages.py         what the agent is told, and finding the approval a conversation names
    gateway_answers.py the gateway's own chat completions and streams
"""
