import { MEMP } from 'memp-sdk'

const broker = new MEMP({
  apiKey: process.env.MEMP_API_KEY,
  namespace: 'my-app'
})

// Register
await broker.register({ name: 'my-agent', framework: 'langchain' })

// Publish
await broker.memory.put('customer/123', { plan: 'pro', acv: 12000 })

// Read
const data = await broker.memory.get('customer/123')

// Query
const results = await broker.memory.query('customer/*')

// Subscribe (Server-Sent Events)
for await (const event of broker.subscribe('customer/*')) {
  console.log('New memory:', event.value)
}
