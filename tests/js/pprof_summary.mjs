// Summarise a pprof file with npm's pprof-format decoder (independent of protobuf):
// per sample type, the total and, per function identity (name, file, start line), the
// sum of the samples whose stack holds it (once per sample). Prints JSON.
//
//   node pprof_summary.mjs FILE     (gzip-compressed or raw pprof)
import { readFileSync } from 'node:fs'
import { gunzipSync } from 'node:zlib'
import { Profile } from 'pprof-format'

let data = readFileSync(process.argv[2])
if (data[0] === 0x1f && data[1] === 0x8b) data = gunzipSync(data)
const profile = Profile.decode(data)
const strings = profile.stringTable.strings
const functions = new Map(profile.function.map((f) => [Number(f.id), f]))
const locations = new Map(profile.location.map((l) => [Number(l.id), l]))
const types = profile.sampleType.map((t) => [strings[Number(t.type)], strings[Number(t.unit)]])
const totals = types.map(() => 0)
const frames = {}
for (const sample of profile.sample) {
  const values = sample.value.map(Number)
  values.forEach((v, i) => { totals[i] += v })
  const seen = new Set()
  for (const id of sample.locationId) {
    for (const line of locations.get(Number(id)).line) {
      const fn = functions.get(Number(line.functionId))
      const key = [strings[Number(fn.name)], strings[Number(fn.filename)], Number(fn.startLine)].join('\t')
      if (seen.has(key)) continue
      seen.add(key)
      frames[key] = (frames[key] || types.map(() => 0)).map((v, i) => v + values[i])
    }
  }
}
console.log(JSON.stringify({ types, totals, frames }))
