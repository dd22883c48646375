// The driver of TestRealNodeSDK: OpenMeter's Node SDK (@openmeter/sdk,
// scripts/client-node.sh) against the ingest at $URL, with the key $TOKEN.
// Run as `node --input-type=module` in the SDK's directory. It ingests one
// event and a batch the way the SDK's README does, then requests the ingest
// refuses, and prints on stdout one JSON object: every request the SDK sent
// (recorded by the fetch it is given, which forwards to Node's own) and,
// for each refusal, what the SDK threw.
import { OpenMeter, HTTPError } from '@openmeter/sdk'

const baseUrl = process.env.URL
const sent = []
// The SDK takes a fetch (its Config); this one notes each request and its
// answer, and changes nothing.
const recording = async (request, init) => {
  const body = await request.clone().text()
  const response = await fetch(request, init)
  sent.push({
    method: request.method,
    url: request.url,
    contentType: request.headers.get('content-type'),
    authorization: request.headers.get('authorization'),
    body: JSON.parse(body),
    status: response.status,
  })
  return response
}

const openmeter = new OpenMeter({ baseUrl, apiKey: process.env.TOKEN, fetch: recording })
const results = {} // what each call resolved to, as a string

// One event, every attribute given (the README's first call).
results.single = String(await openmeter.events.ingest({
  type: 'prompt',
  subject: 'acme-1',
  id: 'node-1',
  source: 'chat-api',
  time: new Date(Date.now() - 61_234),
  data: { tokens: { input: 1250 }, model: 'm1', user: 'u1' },
}))
// A batch with the SDK's defaults: it makes the id, source and time.
results.batch = String(await openmeter.events.ingest([
  { type: 'prompt', subject: 'acme-1', data: { tokens: { input: 850 }, model: 'm2', user: 'u1' } },
  { type: 'prompt', subject: 'acme-2', data: { tokens: { input: '30' }, user: 'u2' } },
]))
// An empty batch (a buffer flushed with nothing in it): the SDK sends [],
// which OpenMeter answers 204.
results.empty = await openmeter.events.ingest([]).then(String, (err) => `threw ${err.message}`)

// Refusals: what the SDK throws.
async function refused(client, events) {
  try {
    await client.events.ingest(events)
    return { thrown: false }
  } catch (err) {
    return {
      thrown: true,
      isHTTPError: err instanceof HTTPError,
      name: err.name,
      message: err.message,
      status: err.status,
      type: err.type,
      title: err.title,
      detail: err.getField?.('detail'),
      errors: err.getField?.('errors'),
    }
  }
}
const good = { type: 'prompt', subject: 'acme-1', id: 'node-refused', source: 'chat-api', data: { tokens: { input: 1 }, user: 'u1' } }
const errors = {}
errors.badToken = await refused(
  new OpenMeter({ baseUrl, apiKey: 'mlk_0123456789abcdef_' + 'A'.repeat(43), fetch: recording }), good)
errors.noToken = await refused(new OpenMeter({ baseUrl, fetch: recording }), good)
errors.noSubject = await refused(openmeter, [good, { type: 'prompt', id: 'node-x', source: 'chat-api', data: good.data }])
errors.fraction = await refused(openmeter, { ...good, data: { tokens: { input: 2.5 }, user: 'u1' } })
errors.unknownType = await refused(openmeter, { ...good, type: 'chat' })
errors.outOfScope = await refused(openmeter, [good, { ...good, subject: 'globex-1' }])

console.log(JSON.stringify({ sent, results, errors }))
